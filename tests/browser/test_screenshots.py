"""Screenshots of both pages in a realistic state, checked like any test.

They are written to the test's temporary directory; with
``RUNLANE_UPDATE_SCREENSHOTS=1`` to ``docs/img/`` (chat.png, ops.png), the
images the README shows.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
from playwright.async_api import expect

from tests.browser.chat_page import QUICK, ChatPage
from tests.browser.conftest import UPSTREAM, Dashboard, OpenPage

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def target(tmp_path: Path) -> Path:
    if os.environ.get("RUNLANE_UPDATE_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        return DOCS_IMG
    return tmp_path


async def test_screenshots_of_the_chat_and_operations_pages(
    open_page: OpenPage, dashboard: Dashboard, tmp_path: Path
) -> None:
    out = target(tmp_path)
    # Some history for the operations page: a run retried after a failure,
    # and one in the dead letter.
    async with httpx.AsyncClient(
        base_url=dashboard.base_url, headers={"Authorization": f"Bearer {dashboard.key}"}
    ) as client:
        UPSTREAM["down"] = True
        for _ in range(2):
            response = await client.post(
                "/v1/runs", json={"agent": "fragile", "input": {}, "max_attempts": 1}
            )
            assert response.status_code == 201
        flaky = await client.post(
            "/v1/runs",
            json={
                "agent": "demo",
                "input": {
                    "text": "I fail once, then resume from my checkpoint.",
                    "turns": 3,
                    "fail_on_attempt": 1,
                    "retry_delay": 0.2,
                },
            },
        )
        flaky_id = flaky.json()["run_id"]

    chat = await open_page(dashboard.url(thread="support-42", agent="demo"))
    page = ChatPage(chat)
    await page.send("Summarise the incident report in one line", options=QUICK)
    await page.expect_done(0)
    await page.send(
        "Draft a reply to the customer explaining the delay",
        options={"turns": 30, "token_delay": 0.15},
    )
    await page.expect_streaming(1, "Draft a reply")
    await page.send("Also mention the refund policy", options=QUICK)
    await page.send(
        "Keep it short: two sentences at most",
        policy="steer",
        options={"turns": 40, "token_delay": 0.2},
    )
    await expect(page.reply(1)).to_have_attribute("data-outcome", "steered")
    await page.expect_streaming(2, "Keep it short: two sentences")
    await page.send("Then translate it to French", policy="enqueue", options=QUICK)
    await expect(page.queued.locator(".text")).to_have_text(
        ["Also mention the refund policy", "Then translate it to French"]
    )
    await page.send("Are you there?", policy="reject")
    await expect(page.notices).to_contain_text("a reply is still running")
    await chat.check("input[name=policy][value=enqueue]")
    await chat.locator("details.options").evaluate("d => { d.open = false; }")
    await expect(page.reply(2).locator(".text")).to_contain_text(
        "Keep it short: two sentences at most Keep it short"
    )
    await chat.screenshot(path=str(out / "chat.png"))

    ops = await open_page(dashboard.url("ops.html"), dashboard.admin_key)
    flaky_row = ops.locator(f'#runs tbody tr[data-run-id="{flaky_id}"]')
    await expect(flaky_row).to_have_attribute("data-status", "completed")
    await expect(ops.locator('.count-card[data-status="dead"] .n')).to_have_text("2")
    await expect(ops.locator("#workers-table tbody tr")).to_have_count(1)
    await flaky_row.click()
    detail = ops.locator("#detail")
    await expect(detail.locator("#attempts tbody tr")).to_have_count(2)
    await expect(detail.locator("#events li").nth(5)).to_be_visible()
    await ops.mouse.move(0, 0)
    await ops.screenshot(path=str(out / "ops.png"), full_page=True)

    assert (out / "chat.png").stat().st_size > 10_000
    assert (out / "ops.png").stat().st_size > 10_000
