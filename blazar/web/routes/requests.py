"""The live requests (``/v1/requests``): each in-flight inference request's card, and ending
one from another connection (``cancel``, ``interrupt``) as a disconnect would. A key sees and
ends only its own; an admin key (and the local token) all.
"""

from __future__ import annotations

from typing import cast

import msgspec
from quart import Response, current_app, request
from quart_trio import QuartTrio

from blazar.auth.keys import ADMIN
from blazar.errors import BlazarError
from blazar.serve.cards import Card, Cards, CardState, CardView
from blazar.web.asgi.call import current
from blazar.web.asgi.replies import CARDS_KEY, JSON, app_runtime

__all__ = ["register"]


def _cards() -> Cards:
    return cast(Cards, current_app.extensions[CARDS_KEY])


def _card_view(card: Card) -> CardView:
    position = None
    if card.state is CardState.QUEUED and card.model and card.waiter_id is not None:
        position = app_runtime().admission.position(card.model, card.waiter_id)
    return card.view(position)


def _own(card: Card) -> bool:
    """A key sees and ends only its own requests; an admin key (and the local token) all."""
    grant = current().grant
    return grant is None or grant.allows_family(ADMIN) or card.key == grant.name


def _find_card(card_id: str) -> Card:
    card = _cards().get(card_id)
    if card is None or not _own(card):
        raise BlazarError("NOT_FOUND", f"no request {card_id} — see GET /v1/requests for the live ones")
    return card


async def list_requests() -> Response:
    model, state = request.args.get("model"), request.args.get("state")
    views = [
        _card_view(c)
        for c in _cards().all()
        if _own(c) and (model is None or c.model == model) and (state is None or c.state == state)
    ]
    return Response(msgspec.json.encode({"object": "list", "data": views}), content_type=JSON)


async def get_request(card_id: str) -> Response:
    return Response(msgspec.json.encode(_card_view(_find_card(card_id))), content_type=JSON)


async def cancel_request(card_id: str) -> Response:
    card = _find_card(card_id)
    ended = card.end_from_outside(CardState.CANCELLED, "cancelled by POST /v1/requests/{id}/cancel")
    return Response(msgspec.json.encode({"id": card_id, "cancelled": ended}), content_type=JSON)


async def interrupt_request(card_id: str) -> Response:
    card = _find_card(card_id)
    ended = card.end_from_outside(CardState.INTERRUPTED, "interrupted by POST /v1/requests/{id}/interrupt")
    return Response(msgspec.json.encode({"id": card_id, "interrupted": ended}), content_type=JSON)


def register(app: QuartTrio) -> None:
    app.get("/v1/requests")(list_requests)
    app.get("/v1/requests/<card_id>")(get_request)
    app.post("/v1/requests/<card_id>/cancel")(cancel_request)
    app.post("/v1/requests/<card_id>/interrupt")(interrupt_request)
