"""The web view in a real browser: Debian's Chromium driven by Playwright for Python.

``browser`` (per test): headless Chromium at ``SUNROOM_CHROMIUM`` or ``/usr/bin/chromium``,
launched by Playwright's own driver (no browser download). Where it is missing the test is
skipped with the reason, or fails when ``SUNROOM_REQUIRE_BROWSER=1`` (CI). ``page_for``
opens a fresh browser context (its own cookies) on a server, logged in or not. ``shot``
saves a screenshot under ``build/screenshots/`` (or ``SUNROOM_SCREENSHOTS``), named by test.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.service.conftest import TOKEN, Server, make_server

__all__ = ["make_server"]  # the service tests' fixture: a real server on loopback

SCREENSHOTS = Path(
    os.environ.get("SUNROOM_SCREENSHOTS", Path(__file__).parents[2] / "build" / "screenshots")
)


def chromium_path() -> str | None:
    """The system Chromium to drive, or None."""
    named = os.environ.get("SUNROOM_CHROMIUM")
    if named:
        return named if Path(named).exists() else None
    for candidate in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if Path(candidate).exists():
            return candidate
    return shutil.which("chromium")


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Headless Debian Chromium (see the module docstring).

    One per test: Playwright's sync API keeps an event loop running in this thread while it
    is started, which would break the asyncio tests a worker runs next.
    """
    path = chromium_path()
    if path is None:
        reason = "no Chromium here (apt-get install chromium, or set SUNROOM_CHROMIUM)"
        if os.environ.get("SUNROOM_REQUIRE_BROWSER") == "1":
            pytest.fail(f"a browser is required here (SUNROOM_REQUIRE_BROWSER=1): {reason}")
        pytest.skip(reason)
    with sync_playwright() as p:
        # --no-sandbox: Chromium's own sandbox refuses to start as root (CI runs as root)
        launched = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


PageFor = Callable[..., Page]


@pytest.fixture
def page_for(browser: Browser) -> Iterator[PageFor]:
    """``page_for(server, login=True)``: a page of a new context on *server*'s web view."""
    contexts = []

    def open_page(server: Server, *, login: bool = True, path: str = "/") -> Page:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(20_000)
        page.goto(server.url + path)
        if login:
            log_in(page)
        return page

    yield open_page
    for context in contexts:
        context.close()


def log_in(page: Page, token: str = TOKEN) -> None:
    """Type the token into the login form and wait for the sessions list."""
    page.get_by_test_id("login-token").fill(token)
    page.get_by_test_id("login-submit").click()
    wait_view(page, "list")


def wait_view(page: Page, view: str) -> None:
    """Wait until the page shows *view* (``login``, ``list`` or ``session``).

    A selector, not ``wait_for_function``: the page's CSP forbids the eval that needs.
    """
    page.wait_for_selector(f"body[data-view='{view}']", state="attached")


@pytest.fixture
def shot(request: pytest.FixtureRequest) -> Callable[[Page, str], Path]:
    """``shot(page, name)``: a full-page screenshot saved as ``<test>-<name>.png``."""

    def take(page: Page, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{request.node.name}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
