"""The operations page in Chromium: counts and filters, a run's attempts and
live events, cancel and retry, waiting lanes, workers."""

from __future__ import annotations

from typing import Any

import httpx
from playwright.async_api import Page, expect

from tests.browser.conftest import UPSTREAM, Dashboard, OpenPage


async def submit_run(
    client: httpx.AsyncClient, input: dict[str, Any], agent: str = "demo", **extra: Any
) -> str:
    response = await client.post("/v1/runs", json={"agent": agent, "input": input, **extra})
    assert response.status_code == 201, response.text
    return str(response.json()["run_id"])


async def submit_request(client: httpx.AsyncClient, thread: str, input: dict[str, Any]) -> Any:
    response = await client.post(
        f"/v1/threads/{thread}/requests", json={"agent": "demo", "input": input}
    )
    assert response.status_code == 201, response.text
    return response.json()


def row(page: Page, run_id: str) -> Any:
    return page.locator(f'#runs tbody tr[data-run-id="{run_id}"]')


async def test_runs_counts_detail_events_cancel_retry_lanes_and_workers(
    open_page: OpenPage, dashboard: Dashboard
) -> None:
    async with dashboard.server.client(dashboard.key) as client:
        done = await submit_run(client, {"text": "short and sweet", "turns": 1})
        # Fails on its only attempt: dead (the dead letter).
        UPSTREAM["down"] = True
        dead = await submit_run(client, {}, agent="fragile", max_attempts=1)
        long = await submit_run(
            client, {"text": "long running work", "turns": 100, "token_delay": 0.1}
        )
        # A lane that pauses: its running reply is cancelled while one waits.
        first = await submit_request(client, "ops-thread", {"text": "first", "turns": 100})
        await submit_request(client, "ops-thread", {"text": "waiting", "turns": 1})

    page = await open_page(dashboard.url("ops.html"), dashboard.admin_key)
    await expect(page.locator("#role")).to_have_text("admin")
    await expect(row(page, done)).to_have_attribute("data-status", "completed")
    await expect(row(page, dead)).to_have_attribute("data-status", "dead")
    await expect(page.locator('.count-card[data-status="dead"] .n')).to_have_text("1")
    await expect(page.locator('.count-card[data-status="completed"] .n')).to_have_text("1")
    await expect(page.locator('.count-card[data-status="running"] .n')).to_have_text("2")

    # Workers alive (admin endpoint).
    worker = page.locator("#workers-table tbody tr", has_text=dashboard.worker_id)
    await expect(worker).to_have_attribute("data-alive", "true")

    # Filter by status: only the dead run is listed.
    await page.select_option("#f-status", "dead")
    await expect(page.locator("#runs tbody tr")).to_have_count(1)
    await expect(row(page, dead)).to_be_visible()
    await page.select_option("#f-status", "")
    await expect(page.locator("#runs tbody tr")).to_have_count(4)

    # A running run: its events arrive live; cancel it.
    await row(page, long).click()
    detail = page.locator("#detail")
    await expect(detail.locator("#detail-status")).to_have_text("running")
    # Live: more events arrive while the page shows it.
    await expect(detail.locator("#events li").nth(4)).to_be_visible()
    seen = await detail.locator("#events li").count()
    await expect(detail.locator("#events li").nth(seen + 2)).to_be_visible()
    await expect(detail.locator("#events li").first).to_contain_text("token")
    await expect(detail.locator("#attempts tbody tr")).to_have_count(1)
    await expect(detail.locator("#attempts tbody tr")).to_contain_text(dashboard.worker_id)
    await detail.get_by_role("button", name="Cancel run").click()
    await expect(detail.locator("#detail-status")).to_have_text("cancelled")
    await expect(row(page, long)).to_have_attribute("data-status", "cancelled")

    # The dead run: its attempt, its error; retry it (admin) and it completes.
    await row(page, dead).click()
    await expect(detail.locator("#detail-status")).to_have_text("dead")
    await expect(detail.locator("#attempts tbody tr")).to_have_count(1)
    await expect(detail.locator("#attempts")).to_contain_text("the upstream service is down")
    UPSTREAM["down"] = False
    await detail.get_by_role("button", name="Retry").click()
    await expect(detail.locator("#detail-status")).to_have_text("completed", timeout=20_000)
    await expect(detail.locator("#attempts tbody tr")).to_have_count(2)
    await expect(detail.locator("#events li").last).to_contain_text("upstream is back")
    await expect(page.locator('.count-card[data-status="dead"] .n')).to_have_text("0")

    # A paused lane is listed with why; continue it from here.
    async with dashboard.server.client(dashboard.key) as client:
        await client.post(f"/v1/runs/{first['run_id']}/cancel")
    lane = page.locator('#lanes tbody tr[data-thread="ops-thread"]')
    await expect(lane).to_have_attribute("data-state", "paused")
    await expect(lane).to_contain_text("run_cancelled")
    await expect(lane).to_contain_text("alice")
    # Continue acts for the key's own user; the lane is alice's, so an admin
    # of another user is refused and says so.
    await lane.get_by_role("button", name="Continue").click()
    refused = page.locator("#notices .notice", has_text="continue ops-thread")
    await expect(refused).to_contain_text("this is alice's")


async def test_a_user_key_sees_its_own_runs_and_no_workers(
    open_page: OpenPage, dashboard: Dashboard
) -> None:
    async with dashboard.server.client(dashboard.key) as client:
        mine = await submit_run(client, {"text": "mine", "turns": 1})
        request = await submit_request(client, "my-thread", {"text": "hello", "turns": 200})
        await submit_request(client, "my-thread", {"text": "later", "turns": 1})
    async with dashboard.server.client(dashboard.admin_key) as client:
        theirs = await submit_run(client, {"text": "not yours", "turns": 1})

    page = await open_page(dashboard.url("ops.html"), dashboard.key)
    await expect(page.locator("#role")).to_have_text("user")
    await expect(row(page, mine)).to_have_attribute("data-status", "completed")
    await expect(row(page, theirs)).to_have_count(0)
    await expect(page.locator("#workers-na")).to_have_text(
        "Not available: workers are shown to admin keys."
    )

    # Without the admin overview, paused lanes are found from the threads
    # listed; this key's user may continue its own lane.
    async with dashboard.server.client(dashboard.key) as client:
        await client.post(f"/v1/runs/{request['run_id']}/cancel")
    lane = page.locator('#lanes tbody tr[data-thread="my-thread"]')
    await expect(lane).to_have_attribute("data-state", "paused")
    await lane.get_by_role("button", name="Continue").click()
    await expect(lane).to_have_count(0)
    await expect(page.locator("#runs tbody tr", has_text="my-thread")).to_have_count(2)
