"""Headless Chromium (Debian's ``chromium``) driven by Playwright for Python, for the web
console's tests: a page that records its network requests and console errors."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support import ROOT

CHROMIUM = os.environ.get("BLAZAR_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(os.environ.get("BLAZAR_CONSOLE_SHOTS", ROOT / ".cache" / "console-shots"))
"""Where each view's screenshot goes: a test artifact, outside the tracked tree, so a test run
leaves the checkout clean; ``BLAZAR_CONSOLE_SHOTS=docs/console`` refreshes the committed ones
that docs/console.md shows."""


def skip_reason() -> str | None:
    """Why the browser tests cannot run here, or None: the browser fixture then fails with it
    (``make test`` installs both, so a missing one is a broken install, never a skip)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: `make install` (it is in the test extra)"
    if not Path(CHROMIUM).exists():
        return (
            f"no Chromium at {CHROMIUM}: run `scripts/setup-browser.sh` (installs Debian's chromium "
            "with apt) or point BLAZAR_CHROMIUM at one"
        )
    return None


@dataclass
class Watched:
    page: Any
    origin: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def foreign(self) -> list[str]:
        """Requests to any host but the daemon (data: URLs, and blob: URLs the page made
        itself, never leave the page)."""
        ours = urlsplit(self.origin).netloc
        return [
            u
            for u in self.requests
            if not u.startswith(("data:", f"blob:{self.origin}/")) and urlsplit(u).netloc != ours
        ]

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"))


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    reason = skip_reason()
    if reason is not None:
        pytest.fail(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def watched_page(browser: Any, origin: str, *, allow: tuple[str, ...] = ()) -> Iterator[Watched]:
    """A fresh tab (its own session storage) on ``origin``; on leaving, the test fails if the
    page logged an error or asked any other host for anything."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    w = Watched(page=page, origin=origin)
    page.on("request", lambda r: w.requests.append(r.url))

    def console(m: Any) -> None:
        if m.type == "error" and not any(a in m.text for a in allow):
            w.errors.append(m.text)

    page.on("console", console)
    page.on("pageerror", lambda e: w.errors.append(str(e)))
    try:
        yield w
        assert not w.errors, w.errors
        assert not w.foreign(), w.foreign()
        assert any(u.endswith("/api/console/events?interval_ms=1000") for u in w.requests), w.requests
    finally:
        context.close()
