"""The chat page in Chromium: queue apart from the conversation, steer,
cancel, stop, pause and continue, interrupt and answer, reload mid-stream."""

from __future__ import annotations

import re

from playwright.async_api import Request, expect

from tests.browser.chat_page import QUICK, SLOW, ChatPage
from tests.browser.conftest import Dashboard, OpenPage


async def open_chat(
    open_page: OpenPage, dashboard: Dashboard, thread: str, agent: str = "demo"
) -> ChatPage:
    page = await open_page(dashboard.url(thread=thread, agent=agent))
    chat = ChatPage(page)
    await expect(chat.lane_state).to_have_text("idle")
    await expect(page.locator("#thread-title")).to_have_text(thread)
    return chat


async def test_three_messages_wait_in_the_queue_then_are_answered_in_order(
    open_page: OpenPage, dashboard: Dashboard
) -> None:
    chat = await open_chat(open_page, dashboard, "three")
    await chat.options({"turns": 3, "token_delay": 0.15})
    await chat.send("one two three four")
    await chat.send("second message")
    await chat.send("third message")

    # While the first reply streams, the other two wait in the queue area
    # with their positions, and not in the conversation.
    await chat.expect_streaming(0, "one two")
    await expect(chat.queued.locator(".text")).to_have_text(["second message", "third message"])
    await expect(chat.queued.locator(".position")).to_have_text(["#1", "#2"])
    await expect(chat.users).to_have_text(["one two three four"])
    await expect(chat.lane_state).to_have_text("running")

    # Then each is answered in turn: request 1, reply 1, request 2, reply 2...
    for index in range(3):
        await chat.expect_done(index)
    await expect(chat.page.locator("#conversation .msg .text")).to_have_text(
        [
            "one two three four",
            "one two three four one two three four one two three four",
            "second message",
            "second message second message second message",
            "third message",
            "third message third message third message",
        ]
    )
    await expect(chat.queued).to_have_count(0)
    await expect(chat.page.locator("#queue-empty")).to_be_visible()
    await expect(chat.lane_state).to_have_text("idle")


async def test_a_promoted_steer_ends_the_reply_early_and_is_answered_next(
    open_page: OpenPage, dashboard: Dashboard
) -> None:
    chat = await open_chat(open_page, dashboard, "steering")
    await chat.send("tell me a long story", options=SLOW)
    await chat.expect_streaming(0, "tell me a long story tell")
    await chat.send("and then what", options=QUICK)
    await chat.send("actually stop and summarise")
    await expect(chat.queued.locator(".text")).to_have_text(
        ["and then what", "actually stop and summarise"]
    )

    await (
        chat.queued_item("actually stop and summarise").get_by_role("button", name="Steer").click()
    )

    first = chat.reply(0)
    await expect(first).to_have_attribute("data-outcome", "steered")
    await expect(first).to_have_attribute("data-status", "completed")
    await expect(first.locator(".note")).to_have_text("ended early: a steer arrived")
    # The steer is answered next, then the input that was queued before it.
    await expect(chat.users).to_have_text(
        ["tell me a long story", "actually stop and summarise", "and then what"]
    )
    await chat.expect_done(1)
    await chat.expect_done(2)
    await expect(chat.reply(1).locator(".text")).to_have_text("actually stop and summarise")
    # Ended early: far fewer than the 40 turns of 5 words it was asked for.
    words = (await first.locator(".text").inner_text()).split()
    assert 0 < len(words) < 40 * 5
    await expect(chat.queued).to_have_count(0)


async def test_cancel_a_queued_input_stop_the_reply_and_continue_the_paused_lane(
    open_page: OpenPage, dashboard: Dashboard
) -> None:
    chat = await open_chat(open_page, dashboard, "cancelling")
    await chat.send("a very long answer please", options=SLOW)
    await chat.expect_streaming(0, "a very long")
    await chat.send("keep me", options=QUICK)
    await chat.send("drop me")
    await expect(chat.queued).to_have_count(2)

    # A rejected input says why, and goes nowhere.
    await chat.send("only if idle", policy="reject")
    await expect(chat.notices.filter(has_text="only if idle")).to_contain_text(
        "a reply is still running"
    )
    await expect(chat.queued).to_have_count(2)

    # Cancel a queued input: it leaves the queue, the others move up.
    await chat.queued_item("drop me").get_by_role("button", name="Cancel").click()
    await expect(chat.queued.locator(".text")).to_have_text(["keep me"])
    await expect(chat.queued.locator(".position")).to_have_text(["#1"])

    # Stop the running reply: it ends cancelled; an input waits, so the
    # lane pauses and says why.
    await chat.page.get_by_role("button", name="Stop").click()
    await expect(chat.reply(0)).to_have_attribute("data-status", "cancelled")
    await expect(chat.reply(0).locator(".note")).to_have_text("stopped")
    await expect(chat.lane_state).to_have_text("paused")
    banner = chat.page.locator("#paused-banner")
    await expect(banner).to_contain_text("the last reply was stopped")
    await expect(chat.queued.locator(".text")).to_have_text(["keep me"])
    await expect(chat.users).to_have_text(["a very long answer please"])

    await banner.get_by_role("button", name="Continue").click()
    await expect(chat.users).to_have_text(["a very long answer please", "keep me"])
    await chat.expect_done(1)
    await expect(chat.queued).to_have_count(0)
    await expect(chat.lane_state).to_have_text("idle")
    await expect(banner).to_have_count(0)


async def test_stop_a_running_reply(open_page: OpenPage, dashboard: Dashboard) -> None:
    chat = await open_chat(open_page, dashboard, "stopping")
    await chat.send("stream until stopped", options=SLOW)
    await chat.expect_streaming(0, "stream until stopped stream")
    stop = chat.page.get_by_role("button", name="Stop")
    await stop.click()
    await expect(chat.reply(0)).to_have_attribute("data-status", "cancelled")
    # Nothing waited, so the lane is simply idle again.
    await expect(chat.lane_state).to_have_text("idle")
    await expect(stop).to_be_hidden()
    await chat.send("next one", options=QUICK)
    await chat.expect_done(1)


async def test_answer_an_interrupt(open_page: OpenPage, dashboard: Dashboard) -> None:
    chat = await open_chat(open_page, dashboard, "deploys", agent="approver")
    await chat.send("deploy to production")

    first = chat.reply(0)
    await expect(first).to_have_attribute("data-status", "interrupted")
    await expect(first.locator(".note")).to_have_text("asks: Shall I deploy to production?")
    await expect(chat.lane_state).to_have_text("interrupted")
    form = chat.page.locator("#interrupt-form")
    await expect(form.locator(".question")).to_have_text("Shall I deploy to production?")

    # A new input is refused while the agent waits, and says why.
    await chat.send("hello?")
    await expect(chat.notices.filter(has_text="hello?")).to_contain_text("waiting for your answer")

    await form.get_by_label("Answer").fill("yes, go")
    await form.get_by_role("button", name="Answer").click()
    await expect(chat.replies).to_have_count(2)
    await chat.expect_done(1)
    await expect(chat.reply(1).locator(".text")).to_have_text("You answered 'yes, go', so: done.")
    await expect(chat.users.nth(1)).to_contain_text("↩")
    await expect(chat.lane_state).to_have_text("idle")
    await expect(form).to_have_count(0)


async def test_reload_mid_stream_restores_everything_and_the_stream_goes_on(
    open_page: OpenPage, dashboard: Dashboard
) -> None:
    chat = await open_chat(open_page, dashboard, "reloading")
    await chat.send("word by word", options={"turns": 25, "token_delay": 0.08})
    await chat.expect_streaming(0, "word by word word by word")
    await chat.send("after the reload", options=QUICK)
    await expect(chat.queued.locator(".text")).to_have_text(["after the reload"])
    before = len((await chat.reply(0).locator(".text").inner_text()).split())

    await chat.page.reload()

    # The key is still there (session storage), and the page is rebuilt from
    # the server: the reply so far, still streaming, and the queue.
    await expect(chat.page.locator("#key-gate")).to_be_hidden()
    await expect(chat.users.first).to_have_text("word by word")
    await expect(chat.queued.locator(".text")).to_have_text(["after the reload"])
    await expect(chat.reply(0).locator(".text")).to_contain_text("word by word word by word")
    await expect(chat.reply(0)).to_have_attribute("data-status", "running")
    await expect(chat.reply(0).locator(".text")).to_have_text(
        re.compile(rf"^(word by word ?){{{before // 3 + 2},}}")
    )
    await chat.expect_done(0)
    assert (await chat.reply(0).locator(".text").inner_text()).split() == [
        "word",
        "by",
        "word",
    ] * 25
    await chat.expect_done(1)
    await expect(chat.users).to_have_text(["word by word", "after the reload"])


async def test_a_dropped_stream_resumes_with_last_event_id(
    open_page: OpenPage, dashboard: Dashboard
) -> None:
    chat = await open_chat(open_page, dashboard, "dropping")
    resumed_from: list[int] = []

    def on_request(request: Request) -> None:
        if request.url.endswith("/events") and "last-event-id" in request.headers:
            resumed_from.append(int(request.headers["last-event-id"]))

    chat.page.on("request", on_request)
    await chat.send("one more time", options={"turns": 20, "token_delay": 0.08})
    await chat.expect_streaming(0, "one more time one")
    # Cut every connection at the server, the run's event stream included.
    for connection in list(dashboard.server.server.server_state.connections):
        connection.transport.close()
    # The page reconnects, sending the last seq it has; the server replays
    # only what came later: no token lost, none twice.
    await chat.expect_done(0)
    assert resumed_from and min(resumed_from) >= 4
    assert (await chat.reply(0).locator(".text").inner_text()).split() == [
        "one",
        "more",
        "time",
    ] * 20
