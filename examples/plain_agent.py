"""A plain runlane agent (no framework), in one command:

    python examples/plain_agent.py

It uses RUNLANE_DATABASE_URL, or starts runlane's embedded PostgreSQL, runs a
worker in this process and submits a request into a thread. The agent is a
support bot written against ``RunContext`` alone: each model call is a turn
(``ctx.turn()``, a safe point), the model's words are ``token`` events, tool
calls and results are events too, progress is checkpointed, and the refund
(an effect on the outside world) asks a human first (``ctx.interrupt``) and
then goes through ``ctx.once`` with an idempotency key. The run ends
``interrupted``; this script answers the question (a runlane resume) and the
resumed run finishes the conversation. Every event is printed.

No network: the "model" is scripted and streams its words with small delays.
See docs/agents.md.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import runlane
from runlane.database import resolve_database_url
from runlane.lane_service import LaneService
from runlane.lane_store import LaneStore
from runlane.models import Event, Run, RunStatus
from runlane.service import RunService
from runlane.worker import Worker

AGENT = "support-bot"
app = runlane.App()


# -- the outside world: a scripted model and two tools ---------------------------

# What the model says in each turn, and the tool it calls then (if any).
SCRIPT: list[tuple[str, tuple[str, dict[str, Any]] | None]] = [
    ("Let me look up order 1042.", ("look_up_order", {"order_id": "1042"})),
    (
        "The parcel was lost in transit. I can refund the 25.00 EUR.",
        ("refund", {"order_id": "1042", "amount": "25.00 EUR"}),
    ),
    ("All set: the refund is on its way. Anything else?", None),
]


async def model_stream(text: str) -> AsyncIterator[str]:
    """A stand-in for a streaming chat model."""
    for i, word in enumerate(text.split()):
        await asyncio.sleep(0.03)
        yield word if i == 0 else " " + word


async def look_up_order(order_id: str) -> dict[str, Any]:
    await asyncio.sleep(0.2)
    return {"order_id": order_id, "status": "lost in transit", "paid": "25.00 EUR"}


class Payments:
    """A stand-in for a payment API that honours idempotency keys."""

    def __init__(self) -> None:
        self.refunds: dict[str, dict[str, Any]] = {}

    async def refund(self, order_id: str, amount: str, *, idempotency_key: str) -> dict[str, Any]:
        await asyncio.sleep(0.1)
        if idempotency_key not in self.refunds:
            self.refunds[idempotency_key] = {"refund_id": f"re_{uuid.uuid4().hex[:8]}"}
        return {**self.refunds[idempotency_key], "order_id": order_id, "amount": amount}


payments = Payments()


# -- the agent ---------------------------------------------------------------------


@app.agent(AGENT)
async def support_bot(ctx: runlane.RunContext) -> dict[str, Any]:
    # Where an earlier attempt (or the interrupted run) got to.
    state = ctx.checkpoint or {"turn": 0, "asked": False, "results": []}
    for turn in range(state["turn"] + 1, len(SCRIPT) + 1):
        text, call = SCRIPT[turn - 1]
        if not state["asked"]:
            await ctx.turn()  # a safe point, and one model call of budget.max_turns
            async for token in model_stream(text):
                await ctx.emit("token", {"text": token, "turn": turn})
        if call is None:
            state = {**state, "turn": turn}
            await ctx.save_checkpoint(state)
            await ctx.safe_point()  # after a turn with no tool calls
            continue
        name, args = call
        if not state["asked"]:
            await ctx.emit("tool_call", {"tool": name, "args": args})
        if name == "look_up_order":
            result = await look_up_order(**args)
        elif not state["asked"]:
            # Ask a human before money moves: the run ends interrupted, and
            # the resume run starts from this checkpoint with the answer.
            await ctx.save_checkpoint({**state, "asked": True})
            await ctx.interrupt({"ask": f"Refund {args['amount']} for order {args['order_id']}?"})
        elif isinstance(ctx.resume_value, dict) and ctx.resume_value.get("approved"):
            result = await refund_once(ctx, **args)
        else:
            result = {"refunded": False, "reason": "not approved"}
        await ctx.emit("tool_result", {"tool": name, "result": result})
        state = {"turn": turn, "asked": False, "results": [*state["results"], result]}
        await ctx.save_checkpoint(state)
    return {"answer": SCRIPT[-1][0], "tool_results": state["results"]}


async def refund_once(ctx: runlane.RunContext, order_id: str, amount: str) -> Any:
    """The refund, recorded once per run: a later attempt gets the recorded
    result. A process that dies between the refund and its record would
    refund again, so the payment API gets the same idempotency key."""
    key = f"refund:{order_id}"
    return await ctx.once(
        key, lambda: payments.refund(order_id, amount, idempotency_key=f"{ctx.run_id}:{key}")
    )


# -- the client side: submit, watch, approve -----------------------------------------


async def watch(service: RunService, run_id: Any, timeout: float = 60) -> Run:
    """Prints the run's events as they come; returns the run once it ends."""
    streaming = False
    async with asyncio.timeout(timeout):
        async for item in service.follow(run_id, poll_seconds=0.05):
            if isinstance(item, Run):
                print(("\n" if streaming else "") + f"run {str(item.id)[:8]}: {item.status}")
                return item
            assert isinstance(item, Event)
            if item.kind == "token":
                if not streaming:
                    print("  model: ", end="")
                    streaming = True
                print(item.data["text"], end="", flush=True)
                continue
            if streaming:
                print()
                streaming = False
            # (jsonb keeps an object's keys in an order of its own: sort them.)
            if item.kind == "tool_call":
                args = ", ".join(f"{k}={v!r}" for k, v in sorted(item.data["args"].items()))
                print(f"  tool call: {item.data['tool']}({args})")
            else:
                result = json.dumps(item.data["result"], sort_keys=True)
                print(f"  tool result: {item.data['tool']} -> {result}")
    raise AssertionError("follow() ends with the run")


async def main() -> int:
    settings = app.settings
    # RUNLANE_DATABASE_URL, or the embedded server (started, and migrated).
    url = await asyncio.to_thread(resolve_database_url, settings)
    worker = Worker(app, url, settings=settings, concurrency=2)
    await worker.start()
    try:
        service = RunService(worker.store, settings)
        lanes = LaneService(LaneStore(worker.store.pool), service)
        thread = f"example-{uuid.uuid4().hex[:8]}"
        request, _ = await lanes.submit(
            tenant="example",
            user_id="me",
            agent=AGENT,
            thread_id=thread,
            input={"message": "My parcel never arrived (order 1042)."},
        )
        assert request.run_id is not None, "a new thread starts its request at once"
        print(f"submitted a request into thread {thread!r}: run {str(request.run_id)[:8]}")

        run = await watch(service, request.run_id)
        if run.status is not RunStatus.INTERRUPTED:
            print(f"expected the run to ask for approval; it ended {run.status}: {run.error}")
            return 1
        print(f"the agent asks: {run.interrupt['ask']}")
        print("answering: approve")
        resume, _ = await lanes.resume(run.id, {"approved": True})

        done = await watch(service, resume.id)
        if done.status is not RunStatus.COMPLETED:
            print(f"expected the resumed run to complete; it ended {done.status}: {done.error}")
            return 1
        print(f"final answer: {done.output['answer']}")
        return 0
    finally:
        await worker.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
