"""Stored chat completions (``store: true``) through the official ``openai`` SDK, on the real
daemon and engine, with two API keys that each see only their own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support import MODEL, DaemonProc, add_key, make_home, start_daemon

pytestmark = pytest.mark.slow


class Keys:
    def __init__(self, home: Path) -> None:
        self.alice = add_key(home, "alice", "chat")
        self.bob = add_key(home, "bob", "chat")
        self.boss = add_key(home, "boss", "chat,admin")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[tuple[DaemonProc, Keys]]:
    home = make_home(tmp_path_factory.mktemp("stored") / "home", model_path)
    keys = Keys(home)
    d = start_daemon(home)
    try:
        yield d, keys
    finally:
        d.stop()


def _client(setup: tuple[DaemonProc, Keys], who: str) -> openai.OpenAI:
    d, keys = setup
    return openai.OpenAI(base_url=f"{d.url}/v1", api_key=getattr(keys, who), max_retries=0, timeout=120)


QUESTION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "Name one colour."}]},
]


def test_whole_answer_is_stored_read_updated_and_deleted(setup: tuple[DaemonProc, Keys]) -> None:
    alice = _client(setup, "alice")
    made = alice.chat.completions.create(
        model=MODEL,
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
        store=True,
        metadata={"topic": "colours", "run": "whole"},
    )
    got = alice.chat.completions.retrieve(made.id)
    assert got.id == made.id and got.model == made.model
    assert got.choices[0].message.content == made.choices[0].message.content
    assert got.usage is not None and made.usage is not None
    assert got.usage.completion_tokens == made.usage.completion_tokens
    assert getattr(got, "metadata", None) == {"topic": "colours", "run": "whole"}

    messages = alice.chat.completions.messages.list(made.id)
    assert [m.role for m in messages.data] == ["system", "user"]
    assert [m.id for m in messages.data] == [f"{made.id}-0", f"{made.id}-1"]
    assert messages.data[1].content == "Name one colour."
    assert messages.data[1].content_parts is not None and messages.data[1].content_parts[0].type == "text"
    newest_first = alice.chat.completions.messages.list(made.id, order="desc", limit=1)
    assert [m.role for m in newest_first.data] == ["user"] and newest_first.has_more

    listed = alice.chat.completions.list(metadata={"run": "whole"})
    assert [c.id for c in listed.data] == [made.id]
    assert alice.chat.completions.list(model="no-such-model").data == []

    updated = alice.chat.completions.update(made.id, metadata={"topic": "paint"})
    assert getattr(updated, "metadata", None) == {"topic": "paint"}
    assert getattr(alice.chat.completions.retrieve(made.id), "metadata", None) == {"topic": "paint"}
    assert alice.chat.completions.list(metadata={"run": "whole"}).data == []

    deleted = alice.chat.completions.delete(made.id)
    assert deleted.deleted and deleted.id == made.id and deleted.object == "chat.completion.deleted"
    with pytest.raises(openai.NotFoundError):
        alice.chat.completions.retrieve(made.id)


def test_stream_is_stored_assembled(setup: tuple[DaemonProc, Keys]) -> None:
    alice = _client(setup, "alice")
    stream = alice.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=16,
        temperature=0,
        store=True,
        stream=True,
        stream_options={"include_usage": True},
        metadata={"run": "stream"},
    )
    ids, text, usage = set(), [], None
    for chunk in stream:
        ids.add(chunk.id)
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    (completion_id,) = ids
    got = alice.chat.completions.retrieve(completion_id)
    assert got.object == "chat.completion"
    assert got.choices[0].message.content == "".join(text) and text
    assert got.choices[0].finish_reason in ("stop", "length")
    assert usage is not None and got.usage is not None
    assert got.usage.completion_tokens == usage.completion_tokens
    assert [m.content for m in alice.chat.completions.messages.list(completion_id).data] == ["Count to five."]


def test_a_key_sees_only_its_own(setup: tuple[DaemonProc, Keys]) -> None:
    alice, bob, boss = (_client(setup, who) for who in ("alice", "bob", "boss"))
    made = alice.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        store=True,
        metadata={"run": "owner"},
    )
    with pytest.raises(openai.NotFoundError):
        bob.chat.completions.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        bob.chat.completions.update(made.id, metadata={"x": "y"})
    with pytest.raises(openai.NotFoundError):
        bob.chat.completions.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        bob.chat.completions.messages.list(made.id)
    assert bob.chat.completions.list(metadata={"run": "owner"}).data == []
    assert [c.id for c in alice.chat.completions.list(metadata={"run": "owner"}).data] == [made.id]
    assert [c.id for c in boss.chat.completions.list(metadata={"run": "owner"}).data] == [made.id]
    assert alice.chat.completions.retrieve(made.id).id == made.id


def test_pages_and_unstored(setup: tuple[DaemonProc, Keys]) -> None:
    bob = _client(setup, "bob")
    made = [
        bob.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Say {i}"}],
            max_tokens=3,
            store=True,
            metadata={"run": "pages"},
        ).id
        for i in range(3)
    ]
    hi: list[dict[str, str]] = [{"role": "user", "content": "Hi"}]
    plain = bob.chat.completions.create(model=MODEL, messages=hi, max_tokens=3)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        bob.chat.completions.retrieve(plain.id)
    first = bob.chat.completions.list(metadata={"run": "pages"}, limit=2)
    assert [c.id for c in first.data] == made[:2] and first.has_more
    rest = bob.chat.completions.list(metadata={"run": "pages"}, limit=2, after=first.data[-1].id)
    assert [c.id for c in rest.data] == made[2:] and not rest.has_more
    desc = bob.chat.completions.list(metadata={"run": "pages"}, order="desc")
    assert [c.id for c in desc.data] == made[::-1]
    # the SDK's auto-pagination walks every page
    assert [c.id for c in bob.chat.completions.list(metadata={"run": "pages"}, limit=1)] == made


def test_metadata_limits(setup: tuple[DaemonProc, Keys]) -> None:
    alice = _client(setup, "alice")
    too_many = {f"k{i}": "v" for i in range(17)}
    cases: list[dict[str, str]] = [too_many, {"k" * 65: "v"}, {"k": "v" * 513}]
    for metadata in cases:
        with pytest.raises(openai.BadRequestError) as err:
            alice.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=2,
                store=True,
                metadata=metadata,
            )
        assert err.value.body is not None and "metadata" in str(err.value.body)
    made = alice.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, store=True
    )
    with pytest.raises(openai.BadRequestError):
        alice.chat.completions.update(made.id, metadata=too_many)
    limits = {f"k{i}": "v" * 512 for i in range(15)} | {"k" * 64: "v"}
    assert getattr(alice.chat.completions.update(made.id, metadata=limits), "metadata", None) == limits


def test_a_stored_completion_survives_a_kill(setup: tuple[DaemonProc, Keys]) -> None:
    d, keys = setup
    alice = _client(setup, "alice")
    made = alice.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=3,
        store=True,
        metadata={"run": "kill"},
    )
    d.proc.kill()  # SIGKILL: no drain, no shutdown hooks
    d.proc.wait()
    again = start_daemon(d.home)
    try:
        after = openai.OpenAI(base_url=f"{again.url}/v1", api_key=keys.alice, max_retries=0, timeout=60)
        got = after.chat.completions.retrieve(made.id)
        assert got.choices[0].message.content == made.choices[0].message.content
        assert [c.id for c in after.chat.completions.list(metadata={"run": "kill"}).data] == [made.id]
    finally:
        again.stop()
