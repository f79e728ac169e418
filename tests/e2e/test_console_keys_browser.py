"""The web console with API keys on, in a real browser: it asks for a key, keeps it for the
tab only, shows a key without the admin scope no admin action, and lets an admin key unload."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser import chromium, watched_page  # noqa: F401  (a fixture)
from tests.e2e.test_keys_e2e import add_key
from tests.support import MODEL, DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow

REFUSED = "status of 401"  # the page's first call, before a key is given, is refused


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory, model_path: Path
) -> Iterator[tuple[DaemonProc, str, str]]:
    home = make_home(tmp_path_factory.mktemp("console-keys") / "home", model_path)
    admin = add_key(home, "boss", "--scope", "admin,chat")
    viewer = add_key(home, "viewer", "--scope", "chat,metrics")
    d = start_daemon(home)
    try:
        r = httpx.post(
            f"{d.url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            headers={"Authorization": f"Bearer {admin}"},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        yield d, admin, viewer
    finally:
        d.stop()


def _sign_in(page: Any, url: str, secret: str) -> None:
    page.goto(f"{url}/ui#models")
    page.wait_for_selector("#login[open]")
    page.fill("#login-key", secret)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#conn.conn-live")
    assert page.evaluate("Object.keys(localStorage).length") == 0  # the tab's session only


def test_a_key_without_admin_sees_no_admin_action(chromium: Any, setup: tuple[DaemonProc, str, str]) -> None:  # noqa: F811
    d, _, viewer = setup
    with watched_page(chromium, d.url, allow=(REFUSED,)) as w:
        _sign_in(w.page, d.url, viewer)
        w.page.wait_for_selector(f"#models-table tr[data-model='{MODEL}']")
        assert "viewer" in w.page.inner_text("#who")
        assert not w.page.is_visible("#pull-card")
        for view in ("models", "requests", "jobs"):
            w.page.click(f"nav a[data-view={view}]")
            w.page.wait_for_selector("#view .card:not([hidden])")
            assert w.page.query_selector_all("#view button[data-action]") == []


def test_an_admin_key_unloads_a_model(chromium: Any, setup: tuple[DaemonProc, str, str]) -> None:  # noqa: F811
    d, admin, _ = setup
    with watched_page(chromium, d.url, allow=(REFUSED,)) as w:
        _sign_in(w.page, d.url, admin)
        w.page.click(f"#models-table tr[data-model='{MODEL}'] button[data-action=unload]")
        w.page.wait_for_selector(f"#models-table tr[data-model='{MODEL}'] button[data-action=load]")
        engines = httpx.get(f"{d.url}/admin/engines", headers={"Authorization": f"Bearer {admin}"}).json()
        assert all(e["state"] != "ready" for e in engines["engines"] if e["model"] == MODEL)
