"""The dashboard in a real browser: Debian's Chromium (``apt-get install
chromium``, never a downloaded build) driven headless by Playwright, against
the HTTP API served by uvicorn and a real worker running the demo agent and
a small agent that asks a question (``ctx.interrupt``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("playwright", reason="pip install runlane[dev] (playwright)")

from playwright.async_api import Browser, BrowserContext, Page, async_playwright, expect

import runlane
from runlane.demo import demo_agent
from runlane.settings import Settings
from tests.api_support import ApiServer, create_key, serve_api
from tests.support import running_worker

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TENANT = "acme"
USER = "alice"

# Auto-waiting assertions wait this long (ms) unless told otherwise.
expect.set_options(timeout=15_000)


# The worker's agents: the built-in demo, and one that asks before acting.
agents = runlane.App()
agents.agent("demo")(demo_agent)


@agents.agent("approver")
async def approver(ctx: runlane.RunContext) -> dict[str, Any]:
    text = ctx.input.get("text", "") if isinstance(ctx.input, dict) else str(ctx.input)
    if ctx.resume_value is None:
        await ctx.emit("token", {"text": f"Ready to {text}."})
        await ctx.interrupt({"ask": f"Shall I {text}?"})
    await ctx.emit("token", {"text": f"You answered {ctx.resume_value!r}, so: done."})
    return {"did": text, "answer": ctx.resume_value}


# The "fragile" agent fails (retryably) until a test repairs it.
UPSTREAM = {"down": True}


@agents.agent("fragile")
async def fragile(ctx: runlane.RunContext) -> dict[str, Any]:
    if UPSTREAM["down"]:
        raise RuntimeError("the upstream service is down")
    await ctx.emit("token", {"text": "upstream is back"})
    return {"ok": True}


@dataclass
class Dashboard:
    server: ApiServer
    key: str
    admin_key: str
    worker_id: str

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def url(self, page: str = "", **hash_params: str) -> str:
        fragment = "&".join(f"{k}={v}" for k, v in hash_params.items())
        return f"{self.base_url}/ui/{page}" + (f"#{fragment}" if fragment else "")


@pytest.fixture
def chromium() -> Path:
    """The system Chromium; the tests never download a browser."""
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("/usr/bin/chromium is missing: .ci/run installs Debian's chromium")
        pytest.skip("Debian's chromium is not installed: apt-get install chromium")
    return CHROMIUM


@pytest.fixture
async def browser(chromium: Path) -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(chromium), args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def dashboard(settings: Settings) -> AsyncIterator[Dashboard]:
    async with (
        serve_api(settings) as server,
        running_worker(agents, settings, concurrency=4) as worker,
    ):
        keys = server.context.keys
        yield Dashboard(
            server=server,
            key=await create_key(keys, TENANT, USER),
            admin_key=await create_key(keys, TENANT, "operator", admin=True),
            worker_id=worker.worker_id,
        )


OpenPage = Callable[..., Awaitable[Page]]


@pytest.fixture
async def open_page(browser: Browser, dashboard: Dashboard) -> AsyncIterator[OpenPage]:
    """Opens a dashboard page in a fresh browser context and pastes the key."""
    contexts: list[BrowserContext] = []

    async def open_(url: str, key: str | None = None) -> Page:
        context = await browser.new_context(viewport={"width": 1360, "height": 900})
        contexts.append(context)
        page = await context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.errors = errors  # type: ignore[attr-defined]
        await page.goto(url)
        await expect(page.locator("#key-gate")).to_be_visible()
        await page.fill("#key-input", key or dashboard.key)
        await page.click("#key-form button[type=submit]")
        await expect(page.locator("#key-gate")).to_be_hidden()
        return page

    yield open_
    for context in contexts:
        for page in context.pages:
            errors = getattr(page, "errors", [])
            assert not errors, f"JavaScript errors on {page.url}: {errors}"
        await context.close()
