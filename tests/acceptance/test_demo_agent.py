"""The demo agent through a real worker: a scripted streaming model whose
tools, failures, approvals and budgets come from its input, with cancel and
steer at its safe points."""

from __future__ import annotations

from collections import Counter
from typing import Any
from uuid import UUID

import pytest

from runlane.demo import app
from runlane.demo_agent import FACTS, MAILBOX, READ_TRIES, DemoInput
from runlane.lane_service import LaneService
from runlane.lanes import LaneState, RequestStatus
from runlane.models import Event, Run, RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from tests.integration.lane_helpers import TENANT, USER
from tests.support import running_worker, wait_until

WORDS = "one two three four"


async def submit(service: RunService, input: dict[str, Any], **kwargs: Any) -> Run:
    kwargs.setdefault("max_attempts", 3)
    run, _ = await service.submit("demo", {"text": WORDS, "token_delay": 0.01, **input}, **kwargs)
    return run


async def submit_in_thread(
    lanes: LaneService, thread: str, input: dict[str, Any], **kwargs: Any
) -> Any:
    request, _ = await lanes.submit(
        tenant=TENANT,
        user_id=USER,
        agent="demo",
        thread_id=thread,
        input={"text": WORDS, "token_delay": 0.01, **input},
        **kwargs,
    )
    return request


async def ended(service: RunService, run_id: UUID, timeout: float = 20) -> Run:
    async def terminal() -> Run | None:
        run = await service.get(run_id)
        return run if run.status.is_terminal else None

    return await wait_until(terminal, timeout=timeout, message=f"run {run_id} to end")


async def events(service: RunService, run_id: UUID, kind: str | None = None) -> list[Event]:
    found = await service.events(run_id)
    return [e for e in found if kind is None or e.kind == kind]


async def first_event(service: RunService, run_id: UUID, kind: str, **data: Any) -> Event:
    async def seen() -> Event | None:
        for event in await events(service, run_id, kind):
            if all(event.data.get(k) == v for k, v in data.items()):
                return event
        return None

    return await wait_until(seen, message=f"a {kind} event {data} of run {run_id}")


def token_turns(found: list[Event]) -> Counter[tuple[int | None, int]]:
    """(attempt, turn) -> tokens streamed."""
    return Counter((e.attempt, e.data["turn"]) for e in found if e.kind == "token")


def summary(found: list[Event]) -> list[tuple[str, Any]]:
    """Each event as (kind, turn or call id)."""
    return [(e.kind, e.data["turn"] if e.kind == "token" else e.data.get("call_id")) for e in found]


# -- the model and its tools ---------------------------------------------------------


async def test_tokens_stream_and_tools_are_called_in_order(
    service: RunService, settings: Settings
) -> None:
    run = await submit(
        service,
        {
            "turns": 1,
            "token_delay": 0.05,
            "tools": [["read", {"tool": "slow", "seconds": 0.3}]],
        },
    )
    async with running_worker(app, settings):
        # Tokens are events as they are streamed, not at the end.
        await first_event(service, run.id, "token")
        assert not (await service.get(run.id)).status.is_terminal
        done = await ended(service, run.id)

    assert done.status is RunStatus.COMPLETED and done.attempts == 1
    # A turn that calls tools is followed by one that answers: 2 turns.
    assert done.output["turns"] == 2 and done.turns == 2
    found = await events(service, run.id)
    assert summary(found) == [
        *[("token", 1)] * 4,
        ("tool_call", "call-1-1"),
        ("tool_result", "call-1-1"),
        ("tool_call", "call-1-2"),
        ("tool_result", "call-1-2"),
        *[("token", 2)] * 4,
    ]
    assert "".join(e.data["text"] for e in found if e.kind == "token") == f"{WORDS} {WORDS}"
    read_call, read_result, slow_call, slow_result = found[4:8]
    assert read_call.data == {
        "turn": 1,
        "call_id": "call-1-1",
        "tool": "read",
        "args": {"key": "inbox"},
    }
    assert read_result.data["result"] == {"key": "inbox", "value": FACTS["inbox"]}
    assert slow_call.data["args"] == {"seconds": 0.3}
    assert slow_result.data["result"] == {"slept": 0.3}
    # The slow tool took its time between its call and its result.
    assert (slow_result.created_at - slow_call.created_at).total_seconds() >= 0.25


async def test_a_failing_tool_is_tried_again_inside_the_attempt(
    service: RunService, settings: Settings
) -> None:
    run = await submit(
        service,
        {
            "turns": 1,
            "tools": [
                [
                    {"tool": "read", "key": "calendar", "fail_times": 2},
                    {"tool": "read", "key": "weather", "fail_times": 5},
                ]
            ],
        },
    )
    async with running_worker(app, settings):
        done = await ended(service, run.id)

    # Both tries of the tool happened inside the run's one attempt.
    assert done.status is RunStatus.COMPLETED and done.attempts == 1
    found = await events(service, run.id)
    errors = Counter(e.data["call_id"] for e in found if e.kind == "tool_error")
    assert errors == {"call-1-1": 2, "call-1-2": READ_TRIES}
    results = {e.data["call_id"]: e.data["result"] for e in found if e.kind == "tool_result"}
    assert results["call-1-1"] == {"key": "calendar", "value": FACTS["calendar"]}
    # Given up on: the model gets the error as the tool's result.
    assert results["call-1-2"]["error"].startswith(f"gave up after {READ_TRIES} tries")


async def test_a_bad_input_fails_the_run_without_retry(
    service: RunService, settings: Settings
) -> None:
    run = await submit(service, {"tools": [["delete-everything"]]})
    async with running_worker(app, settings):
        done = await ended(service, run.id)
    assert done.status is RunStatus.FAILED and done.attempts == 1
    assert done.error is not None and done.error["code"] == "invalid_input"


# -- retries: checkpoints and effects recorded once ------------------------------------


async def test_a_retry_continues_from_the_checkpoint_without_redoing_turn_one(
    service: RunService, settings: Settings
) -> None:
    run = await submit(
        service, {"turns": 3, "fail_on_attempt": 1, "fail_on_turn": 2, "retry_delay": 0}
    )
    async with running_worker(app, settings):
        done = await ended(service, run.id)

    assert done.status is RunStatus.COMPLETED and done.attempts == 2
    assert done.output["resumed_from_turn"] == 1 and done.output["attempt"] == 2
    first, second = await service.attempts(run.id)
    assert first.outcome == "retry" and first.error is not None
    assert first.error["message"] == "scripted failure on attempt 1 at turn 2"
    assert second.outcome == "completed"
    # Turn one streamed once, by the first attempt; turn two, lost with the
    # failure, was done again; turn three only by the second attempt.
    assert token_turns(await events(service, run.id)) == {
        (1, 1): 4,
        (1, 2): 4,
        (2, 2): 4,
        (2, 3): 4,
    }
    # Model calls over both attempts: 1, 2 | 2, 3.
    assert done.turns == 4


async def test_the_write_happens_once_across_a_retry(
    service: RunService, settings: Settings
) -> None:
    # Turn two sends a mail, then the attempt fails before its checkpoint:
    # the retry does turn two again, and ctx.once replays the receipt.
    run = await submit(
        service,
        {
            "turns": 2,
            "tools": [[], [{"tool": "write", "to": "carol", "subject": "minutes"}]],
            "fail_on_attempt": 1,
            "fail_on_turn": 2,
            "retry_delay": 0,
        },
    )
    async with running_worker(app, settings):
        done = await ended(service, run.id)

    assert done.status is RunStatus.COMPLETED and done.attempts == 2
    found = await events(service, run.id)
    [effect] = [e for e in found if e.kind == "effect"]
    assert effect.attempt == 1 and effect.data["to"] == "carol"
    mail_id = effect.data["mail_id"]
    results = [(e.attempt, e.data["result"]) for e in found if e.kind == "tool_result"]
    receipt = {"mail_id": mail_id, "to": "carol"}
    # Both attempts called the tool; the second got the recorded receipt.
    assert results == [(1, receipt), (2, receipt)]
    # The mail API was called once, and delivered one mail.
    assert MAILBOX.calls_of(run.id) == 1
    assert MAILBOX.delivered_to(run.id) == [
        {"mail_id": mail_id, "to": "carol", "subject": "minutes"}
    ]
    assert done.output["sent"] == [mail_id]


# -- approval: interrupt and resume ----------------------------------------------------


APPROVAL = {
    "text": "I will mail Bob the report.",
    "turns": 2,
    "approval": True,
    "tools": [["read", {"tool": "write", "to": "bob", "subject": "the report"}]],
}


async def interrupted(lanes: LaneService, service: RunService, thread: str) -> Run:
    request = await submit_in_thread(lanes, thread, APPROVAL)
    assert request.status is RequestStatus.DISPATCHED
    run = await ended(service, request.run_id)
    assert run.status is RunStatus.INTERRUPTED, run.error
    assert run.interrupt == {
        "ask": "Send the mail 'the report' to bob?",
        "tool": "write",
        "call_id": "call-1-2",
        "args": {"to": "bob", "subject": "the report"},
    }
    snap = await lanes.snapshot(tenant=TENANT, user_id=USER, agent="demo", thread_id=thread)
    assert snap.state is LaneState.INTERRUPTED
    # It asked before sending anything.
    found = await events(service, run.id)
    assert [k for k, _ in summary(found) if k != "token"] == [
        "tool_call",
        "tool_result",
        "tool_call",
    ]
    assert MAILBOX.calls_of(run.id) == 0
    return run


@pytest.mark.parametrize("answer", [{"approved": True}, True, "yes, send it"])
async def test_an_approved_write_is_sent_after_the_resume(
    lanes: LaneService, service: RunService, settings: Settings, answer: Any
) -> None:
    async with running_worker(app, settings):
        asked = await interrupted(lanes, service, "approve")
        resume, _ = await lanes.resume(asked.id, answer)
        done = await ended(service, resume.id)

    assert done.status is RunStatus.COMPLETED, done.error
    found = await events(service, resume.id)
    # The resume run goes on where the question was asked: the approval, the
    # write, then the model's answering turn (turn one is not done again).
    assert summary(found) == [
        ("approval", "call-1-2"),
        ("effect", "call-1-2"),
        ("tool_result", "call-1-2"),
        *[("token", 2)] * 6,
    ]
    assert found[0].data["approved"] is True
    mail_id = found[1].data["mail_id"]
    assert found[2].data["result"] == {"mail_id": mail_id, "to": "bob"}
    assert MAILBOX.delivered_to(resume.id) == [
        {"mail_id": mail_id, "to": "bob", "subject": "the report"}
    ]
    assert done.output["sent"] == [mail_id] and done.output["declined"] == []
    snap = await lanes.snapshot(tenant=TENANT, user_id=USER, agent="demo", thread_id="approve")
    assert snap.state is LaneState.IDLE


@pytest.mark.parametrize("answer", [{"approved": False}, False, "no"])
async def test_a_denied_write_is_not_sent_and_the_model_answers_without_it(
    lanes: LaneService, service: RunService, settings: Settings, answer: Any
) -> None:
    async with running_worker(app, settings):
        asked = await interrupted(lanes, service, "deny")
        resume, _ = await lanes.resume(asked.id, answer)
        done = await ended(service, resume.id)

    assert done.status is RunStatus.COMPLETED, done.error
    found = await events(service, resume.id)
    assert summary(found) == [
        ("approval", "call-1-2"),
        ("tool_result", "call-1-2"),
        *[("token", 2)] * 6,
    ]
    assert found[0].data["approved"] is False
    assert found[1].data["result"] == {"sent": False, "reason": "declined"}
    assert MAILBOX.calls_of(resume.id) == MAILBOX.calls_of(asked.id) == 0
    assert done.output["sent"] == [] and done.output["declined"] == ["call-1-2"]


# -- cancel and steer at safe points ---------------------------------------------------


async def test_a_cancel_during_a_slow_tool_waits_for_the_tool(
    service: RunService, settings: Settings
) -> None:
    run = await submit(service, {"turns": 3, "tools": [[{"tool": "slow", "seconds": 1.0}]]})
    async with running_worker(app, settings):
        await first_event(service, run.id, "tool_call", tool="slow")
        asked = await service.cancel(run.id)
        assert asked.status is RunStatus.CANCEL_REQUESTED
        done = await ended(service, run.id)

    assert done.status is RunStatus.CANCELLED and done.attempts == 1
    found = await events(service, run.id)
    # The tool was never interrupted: its result is the run's last event;
    # the run stopped at the next model call.
    assert summary(found)[-2:] == [("tool_call", "call-1-1"), ("tool_result", "call-1-1")]
    assert found[-1].data["result"] == {"slept": 1.0}
    assert token_turns(found) == {(1, 1): 4}
    assert done.turns == 1


async def test_a_cancel_while_streaming_stops_after_the_turn(
    service: RunService, settings: Settings
) -> None:
    run = await submit(service, {"turns": 20, "token_delay": 0.1})
    async with running_worker(app, settings):
        await first_event(service, run.id, "token")
        await service.cancel(run.id)
        done = await ended(service, run.id)

    assert done.status is RunStatus.CANCELLED
    # The turn being streamed finished; the run stopped at the next safe point.
    tokens = token_turns(await events(service, run.id))
    assert set(tokens.values()) == {4} and len(tokens) < 20


async def test_a_steer_while_streaming_ends_the_run_at_the_next_model_call(
    lanes: LaneService, service: RunService, settings: Settings
) -> None:
    first = await submit_in_thread(lanes, "steered", {"turns": 20, "token_delay": 0.1})
    async with running_worker(app, settings):
        await first_event(service, first.run_id, "token")
        steer = await submit_in_thread(
            lanes, "steered", {"text": "about something else", "turns": 1}, policy="steer"
        )
        done = await ended(service, first.run_id)
        assert done.status is RunStatus.COMPLETED and done.outcome == "steered"

        async def steer_run() -> Any:
            request = await lanes.get_request(tenant=TENANT, request_id=steer.request_id)
            return request.run_id

        answered = await ended(service, await wait_until(steer_run, message="steer dispatched"))

    tokens = token_turns(await events(service, first.run_id))
    assert set(tokens.values()) == {4} and len(tokens) < 20
    assert answered.status is RunStatus.COMPLETED
    assert answered.output["answer"] == "about something else"


async def test_a_steer_never_stops_a_tool(
    lanes: LaneService, service: RunService, settings: Settings
) -> None:
    first = await submit_in_thread(
        lanes, "tooling", {"turns": 3, "tools": [[{"tool": "slow", "seconds": 0.8}]]}
    )
    async with running_worker(app, settings):
        await first_event(service, first.run_id, "tool_call", tool="slow")
        await submit_in_thread(lanes, "tooling", {"turns": 1}, policy="steer")
        done = await ended(service, first.run_id)

    assert done.status is RunStatus.COMPLETED and done.outcome == "steered"
    found = await events(service, first.run_id)
    assert summary(found)[-2:] == [("tool_call", "call-1-1"), ("tool_result", "call-1-1")]
    assert token_turns(found) == {(1, 1): 4}


# -- budgets -------------------------------------------------------------------------


async def test_max_turns_fails_the_run_without_retry(
    service: RunService, settings: Settings
) -> None:
    run = await submit(service, {"turns": 5}, budget={"max_turns": 2})
    async with running_worker(app, settings):
        done = await ended(service, run.id)

    assert done.status is RunStatus.FAILED and done.attempts == 1
    assert done.error is not None and done.error["code"] == "budget_exceeded"
    assert "max_turns" in done.error["message"]
    assert token_turns(await events(service, run.id)) == {(1, 1): 4, (1, 2): 4}


async def test_max_seconds_fails_the_run_without_retry(
    service: RunService, settings: Settings
) -> None:
    run = await submit(service, {"turns": 100, "token_delay": 0.05}, budget={"max_seconds": 0.5})
    async with running_worker(app, settings):
        done = await ended(service, run.id)

    assert done.status is RunStatus.FAILED and done.attempts == 1
    assert done.error is not None and done.error["code"] == "budget_exceeded"
    assert "max_seconds" in done.error["message"]
    assert 0 < len(token_turns(await events(service, run.id))) < 100


# -- the input -----------------------------------------------------------------------


def test_the_simple_input_keeps_its_meaning() -> None:
    spec = DemoInput.parse({"text": "a b", "turns": 2, "fail_on_attempt": 1})
    assert (spec.turns, spec.total_turns, spec.fail_on_turn, spec.tools) == (2, 2, None, ())
    # A failing turn alone means the first attempt.
    assert DemoInput.parse({"fail_on_turn": 2}).fail_on_attempt == 1
    # The last turn that calls tools is followed by one more.
    assert DemoInput.parse({"turns": 1, "tools": [[], ["slow"]]}).total_turns == 3
