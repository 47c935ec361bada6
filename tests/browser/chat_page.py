"""Driving the chat page (/ui/): what a user does, and where things show."""

from __future__ import annotations

import json
from typing import Any

from playwright.async_api import Locator, Page, expect

# A reply that streams for a while (the demo agent: ``turns`` times the
# words of the text, one token event per word).
SLOW = {"turns": 40, "token_delay": 0.1}
# A reply that is done in well under a second.
QUICK = {"turns": 1, "token_delay": 0.02}


class ChatPage:
    def __init__(self, page: Page) -> None:
        self.page = page
        self.conversation = page.locator("#conversation")
        self.users = page.locator("#conversation .msg.user .text")
        self.replies = page.locator("#conversation .msg.reply")
        self.queued = page.locator("#queue-list .queued")
        self.lane_state = page.locator("#lane-state")
        self.notices = page.locator("#notices .notice")

    async def options(self, options: dict[str, Any]) -> None:
        await self.page.locator("details.options").evaluate("d => { d.open = true; }")
        await self.page.fill("#input-extra", json.dumps(options))

    async def send(
        self, text: str, *, policy: str = "enqueue", options: dict[str, Any] | None = None
    ) -> None:
        if options is not None:
            await self.options(options)
        await self.page.check(f"input[name=policy][value={policy}]")
        await self.page.fill("#message", text)
        await self.page.press("#message", "Enter")

    def reply(self, index: int) -> Locator:
        return self.replies.nth(index)

    def queued_item(self, text: str) -> Locator:
        return self.queued.filter(has_text=text)

    async def expect_streaming(self, index: int, fragment: str) -> None:
        """The reply is running and has streamed ``fragment`` already."""
        reply = self.reply(index)
        await expect(reply).to_have_attribute("data-status", "running")
        await expect(reply.locator(".text")).to_contain_text(fragment)

    async def expect_done(self, index: int, *, timeout: float = 30_000) -> None:
        await expect(self.reply(index)).to_have_attribute(
            "data-status", "completed", timeout=timeout
        )
