"""The built-in demo agent: a scripted streaming "model" that calls tools.

No network and no real model: a fake that behaves like a streaming chat
model, scripted by the run's input (every key optional)::

    {"text": str,                  # what the model says each turn, word by word
     "turns": int = 3,             # model turns, 1-1000
     "token_delay": float = 0.05,  # seconds after each token
     "tools": [[call, ...], ...],  # tools[i]: the calls the model makes in turn i+1
     "slow_seconds": float = 1.0,  # how long the slow tool takes, unless a call says
     "approval": bool = false,     # the write tool asks a human first
     "fail_on_attempt": int,       # a scripted failure on this attempt...
     "fail_on_turn": int,          # ...at this turn (then the attempt defaults to 1)
     "retry_delay": float}         # the failure is Retry(delay=...), else a RuntimeError

A call is a tool's name (``"slow"``, ``"read"``, ``"write"``) or an object
naming it with its arguments: ``{"tool": "slow", "seconds": 2}``,
``{"tool": "read", "key": "inbox", "fail_times": 2}``, ``{"tool": "write",
"to": "bob", "subject": "hello"}``; each also takes ``seconds``.

Each turn is one model call:

1. ``await ctx.turn()``: a safe point (cancel, steer, deadline, shutdown,
   lost lease) and one turn counted against ``budget.max_turns``;
2. the model streams ``text`` as ``token`` events ``{"text", "turn"}``;
3. it runs the turn's tool calls, each a ``tool_call`` event then a
   ``tool_result`` event; no safe point between them or inside a tool;
4. the checkpoint ``{"turn": n, ...}`` is saved: a later attempt continues
   after turn n;
5. after a turn that called no tools: ``await ctx.safe_point()``.

A turn that calls tools is always followed by another, in which the model
answers having seen the results: a run has ``max(turns, last turn with
tools + 1)`` turns.

The tools: ``slow`` sleeps; ``read`` looks a key up in a small fake store
(with ``fail_times`` N its first N tries raise ConnectionError and the agent
tries again itself, up to 3 tries with ``tool_error`` events: inside the
attempt, using no queue attempt; after 3 failures the model gets the error
as the result); ``write`` sends a mail through :data:`MAILBOX`, a fake
external API, inside ``ctx.once("write:<call id>")`` and with
``f"{ctx.run_id}:write:<call id>"`` as its idempotency key. The effect emits
an ``effect`` event when it really runs; a later attempt replays the
recorded receipt without sending again.

With ``approval``, a write call first asks a human: the run ends
``interrupted`` with ``{"ask", "tool", "call_id", "args"}``. The resume run
(the same turn, without calling the model again) sends the mail when the
answer is ``true``, ``{"approved": true}`` or a string starting with yes,
y, ok, okay, sure, go, approve(d); any other answer declines, and the model
answers without it.

The scripted failure: on attempt ``fail_on_attempt``, with ``fail_on_turn``
M, after turn M streamed and ran its tools but before its checkpoint (the
next attempt redoes turn M, not the turns before); without ``fail_on_turn``,
right after the first turn the attempt completed.

The output: ``{"answer", "turns", "attempt", "resumed_from_turn", "sent"
(mail ids), "declined" (call ids)}``.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any, NoReturn
from uuid import UUID, uuid4

import runlane

AGENT = "demo"
DEFAULT_TEXT = "Hello from runlane! This answer is streamed word by word."
TOOLS = ("slow", "read", "write")
# How many times the agent tries a failing read tool within one attempt.
READ_TRIES = 3
# How long the read and write tools take unless a call says.
QUICK_TOOL_SECONDS = 0.02
MAX_TOOL_SECONDS = 3600.0
# The fake store the read tool answers from.
FACTS = {
    "inbox": "3 unread messages, one from Bob about the quarterly report",
    "calendar": "stand-up at 10:00, review at 15:00",
    "weather": "sunny, 21 degrees",
}
_YES = re.compile(r"\s*(yes|y|ok|okay|sure|go|approve|approved)\b", re.IGNORECASE)


# -- the input ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCall:
    tool: str
    seconds: float
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DemoInput:
    text: str
    turns: int = 3
    token_delay: float = 0.05
    fail_on_attempt: int | None = None
    retry_delay: float | None = None
    fail_on_turn: int | None = None
    tools: tuple[tuple[ToolCall, ...], ...] = ()
    approval: bool = False

    @classmethod
    def parse(cls, raw: Any) -> DemoInput:
        """Validates the run's input; a bad one fails the run for good."""
        if not isinstance(raw, dict):
            _invalid("the demo agent's input must be a JSON object")
        text = raw.get("text", DEFAULT_TEXT)
        turns = raw.get("turns", 3)
        delay = raw.get("token_delay", 0.05)
        fail_on = raw.get("fail_on_attempt")
        fail_turn = raw.get("fail_on_turn")
        retry_delay = raw.get("retry_delay")
        slow = raw.get("slow_seconds", 1.0)
        approval = raw.get("approval", False)
        if not isinstance(text, str) or not text.split():
            _invalid("text must be a non-empty string")
        if not _is_int(turns) or not 1 <= turns <= 1000:
            _invalid("turns must be an integer from 1 to 1000")
        if not _is_number(delay) or not 0 <= delay <= 10:
            _invalid("token_delay must be 0-10 seconds")
        if fail_on is not None and (not _is_int(fail_on) or fail_on < 1):
            _invalid("fail_on_attempt must be an integer >= 1 or null")
        if fail_turn is not None and (not _is_int(fail_turn) or fail_turn < 1):
            _invalid("fail_on_turn must be an integer >= 1 or null")
        if retry_delay is not None and (not _is_number(retry_delay) or retry_delay < 0):
            _invalid("retry_delay must be a number >= 0 or null")
        if not _is_number(slow) or not 0 <= slow <= MAX_TOOL_SECONDS:
            _invalid(f"slow_seconds must be 0-{MAX_TOOL_SECONDS:g} seconds")
        if not isinstance(approval, bool):
            _invalid("approval must be true or false")
        if fail_turn is not None and fail_on is None:
            fail_on = 1
        return cls(
            text=text,
            turns=turns,
            token_delay=float(delay),
            fail_on_attempt=fail_on,
            retry_delay=None if retry_delay is None else float(retry_delay),
            fail_on_turn=fail_turn,
            tools=_parse_tools(raw.get("tools"), float(slow)),
            approval=approval,
        )

    @property
    def words(self) -> list[str]:
        return self.text.split()

    @property
    def total_turns(self) -> int:
        """A turn that calls tools is followed by one that answers."""
        with_tools = [i + 1 for i, calls in enumerate(self.tools) if calls]
        return max(self.turns, max(with_tools, default=0) + 1)

    def calls_in(self, turn: int) -> tuple[ToolCall, ...]:
        return self.tools[turn - 1] if turn <= len(self.tools) else ()


def _parse_tools(raw: Any, slow_seconds: float) -> tuple[tuple[ToolCall, ...], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > 1000:
        _invalid("tools must be a list (one list of calls per turn, at most 1000)")
    turns = []
    for calls in raw:
        if not isinstance(calls, list) or len(calls) > 20:
            _invalid("each turn's tools must be a list of at most 20 calls")
        turns.append(tuple(_parse_call(call, slow_seconds) for call in calls))
    return tuple(turns)


def _parse_call(raw: Any, slow_seconds: float) -> ToolCall:
    spec = {"tool": raw} if isinstance(raw, str) else raw
    if not isinstance(spec, dict) or spec.get("tool") not in TOOLS:
        _invalid(f"a tool call is one of {', '.join(TOOLS)} or an object with such a 'tool'")
    tool = spec["tool"]
    allowed = {"slow": set(), "read": {"key", "fail_times"}, "write": {"to", "subject"}}[tool]
    unknown = set(spec) - allowed - {"tool", "seconds"}
    if unknown:
        _invalid(f"unknown arguments of the {tool} tool: {sorted(unknown)}")
    seconds = spec.get("seconds", slow_seconds if tool == "slow" else QUICK_TOOL_SECONDS)
    if not _is_number(seconds) or not 0 <= seconds <= MAX_TOOL_SECONDS:
        _invalid(f"a tool's seconds must be 0-{MAX_TOOL_SECONDS:g}")
    args: dict[str, Any] = {}
    if tool == "slow":
        args = {"seconds": float(seconds)}
    elif tool == "read":
        args = {"key": spec.get("key", "inbox"), "fail_times": spec.get("fail_times", 0)}
        if not isinstance(args["key"], str):
            _invalid("the read tool's key must be a string")
        if not _is_int(args["fail_times"]) or not 0 <= args["fail_times"] <= 10:
            _invalid("the read tool's fail_times must be an integer from 0 to 10")
    else:
        args = {"to": spec.get("to", "bob"), "subject": spec.get("subject", "the report")}
        if not all(isinstance(v, str) and v for v in args.values()):
            _invalid("the write tool's to and subject must be non-empty strings")
    return ToolCall(tool=tool, seconds=float(seconds), args=args)


def _invalid(message: str) -> NoReturn:
    raise runlane.Fail("invalid_input", message)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def approves(answer: Any) -> bool:
    """Whether a human's resume value approves the write."""
    if isinstance(answer, bool):
        return answer
    if isinstance(answer, dict):
        return answer.get("approved") is True
    return isinstance(answer, str) and _YES.match(answer) is not None


# -- the outside world: a fake mail API ---------------------------------------------


class Mailbox:
    """A stand-in for an external mail API that honours idempotency keys,
    as a real one should: a send with a key it has seen returns the first
    mail's id and delivers nothing new."""

    KEEP = 10_000

    def __init__(self) -> None:
        # Every call's idempotency key, and each delivered mail by its key.
        self.calls: list[str] = []
        self.delivered: dict[str, dict[str, str]] = {}

    async def send(self, to: str, subject: str, *, idempotency_key: str) -> str:
        self.calls.append(idempotency_key)
        mail = self.delivered.get(idempotency_key)
        if mail is None:
            mail = {"mail_id": f"mail-{uuid4().hex[:12]}", "to": to, "subject": subject}
            self.delivered[idempotency_key] = mail
        # A demo that serves for days keeps only the latest.
        while len(self.delivered) > self.KEEP:
            del self.delivered[next(iter(self.delivered))]
        del self.calls[: -self.KEEP]
        return mail["mail_id"]

    def calls_of(self, run_id: UUID | str) -> int:
        return sum(1 for key in self.calls if key.startswith(f"{run_id}:"))

    def delivered_to(self, run_id: UUID | str) -> list[dict[str, str]]:
        return [m for k, m in self.delivered.items() if k.startswith(f"{run_id}:")]


MAILBOX = Mailbox()


# -- the agent ------------------------------------------------------------------


@dataclass(slots=True)
class DemoState:
    """The checkpoint: turns done, mails sent and declined, and the write
    call waiting for a human's answer."""

    turn: int = 0
    sent: list[str] = field(default_factory=list)
    declined: list[str] = field(default_factory=list)
    awaiting: dict[str, Any] | None = None

    @classmethod
    def load(cls, checkpoint: Any) -> DemoState:
        saved = checkpoint if isinstance(checkpoint, dict) else {}
        turn = saved.get("turn", 0)
        awaiting = saved.get("awaiting")
        return cls(
            turn=turn if _is_int(turn) and turn >= 0 else 0,
            sent=list(saved.get("sent") or []),
            declined=list(saved.get("declined") or []),
            awaiting=awaiting if isinstance(awaiting, dict) else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "sent": self.sent,
            "declined": self.declined,
            "awaiting": self.awaiting,
        }


class ScriptedFailure(RuntimeError):
    """The failure the input asked for."""


async def demo_agent(ctx: runlane.RunContext) -> dict[str, Any]:
    spec = DemoInput.parse(ctx.input)
    state = DemoState.load(ctx.checkpoint)
    resumed_from = state.turn
    # A resume run carries the answer to the write call it stopped at.
    answered = state.awaiting["call_id"] if state.awaiting and ctx.kind == "resume" else None
    failing = spec.fail_on_attempt == ctx.attempt
    for turn in range(state.turn + 1, spec.total_turns + 1):
        calls = spec.calls_in(turn)
        first_call = 0
        if state.awaiting is not None and state.awaiting.get("turn") == turn:
            # The model spoke before the interrupt: go on with its calls.
            first_call = int(state.awaiting.get("call", 0))
        else:
            await ctx.turn()  # a safe point before each model call
            await _stream(ctx, spec, turn)
        for index in range(first_call, len(calls)):
            await _call_tool(ctx, spec, state, turn, index, calls[index], answered)
        if failing and spec.fail_on_turn == turn:
            _scripted_failure(ctx, spec, turn)
        state.turn, state.awaiting = turn, None
        await ctx.save_checkpoint(state.to_json())
        if not calls:
            await ctx.safe_point()  # after a model turn with no tool calls
        if failing and spec.fail_on_turn is None:
            _scripted_failure(ctx, spec, turn)
    if failing and spec.fail_on_turn is None:
        _scripted_failure(ctx, spec, None)
    return {
        "answer": spec.text,
        "turns": spec.total_turns,
        "attempt": ctx.attempt,
        "resumed_from_turn": resumed_from,
        "sent": state.sent,
        "declined": state.declined,
    }


async def _stream(ctx: runlane.RunContext, spec: DemoInput, turn: int) -> None:
    """One model call: its answer, word by word."""
    for index, word in enumerate(spec.words):
        token = word if index == 0 and turn == 1 else " " + word
        await ctx.emit("token", {"text": token, "turn": turn})
        await asyncio.sleep(spec.token_delay)


async def _call_tool(
    ctx: runlane.RunContext,
    spec: DemoInput,
    state: DemoState,
    turn: int,
    index: int,
    call: ToolCall,
    answered: str | None,
) -> None:
    call_id = f"call-{turn}-{index + 1}"
    about = {"turn": turn, "call_id": call_id, "tool": call.tool}
    if answered != call_id:  # the interrupted run showed it already
        await ctx.emit("tool_call", {**about, "args": _shown_args(call)})
    result: Any
    if call.tool == "slow":
        await asyncio.sleep(call.seconds)  # never a safe point inside a tool
        result = {"slept": call.seconds}
    elif call.tool == "read":
        result = await _read(ctx, call, about)
    elif spec.approval and not await _approved(ctx, state, index, call, about, answered):
        result = {"sent": False, "reason": "declined"}
    else:
        result = await _write(ctx, call, about)
        if result["mail_id"] not in state.sent:
            state.sent.append(result["mail_id"])
    await ctx.emit("tool_result", {**about, "result": result})


async def _approved(
    ctx: runlane.RunContext,
    state: DemoState,
    index: int,
    call: ToolCall,
    about: dict[str, Any],
    answered: str | None,
) -> bool:
    """Asks a human (the run ends interrupted), or, in the resume run,
    reads the answer."""
    if answered != about["call_id"]:
        state.awaiting = {"turn": about["turn"], "call": index, "call_id": about["call_id"]}
        await ctx.save_checkpoint(state.to_json())
        await ctx.interrupt(
            {
                "ask": f"Send the mail {call.args['subject']!r} to {call.args['to']}?",
                "tool": call.tool,
                "call_id": about["call_id"],
                "args": call.args,
            }
        )
    approved = approves(ctx.resume_value)
    await ctx.emit("approval", {**about, "approved": approved})
    if not approved and about["call_id"] not in state.declined:
        state.declined.append(about["call_id"])
    return approved


def _shown_args(call: ToolCall) -> dict[str, Any]:
    if call.tool == "read":
        return {"key": call.args["key"]}
    return dict(call.args)


async def _read(ctx: runlane.RunContext, call: ToolCall, about: dict[str, Any]) -> Any:
    """A read that may fail: tried again here, inside the attempt (a queue
    retry would redo the whole turn and spend one of the run's attempts)."""
    error = ""
    for attempt in range(1, READ_TRIES + 1):
        if attempt > 1:
            await asyncio.sleep(0.02 * attempt)  # a short backoff between tries
        try:
            await asyncio.sleep(call.seconds)
            if attempt <= call.args["fail_times"]:
                raise ConnectionError(f"the store timed out (try {attempt})")
            key = call.args["key"]
            return {"key": key, "value": FACTS.get(key, "nothing found")}
        except ConnectionError as exc:
            error = str(exc)
            await ctx.emit("tool_error", {**about, "try": attempt, "error": error})
    return {"error": f"gave up after {READ_TRIES} tries: {error}"}


async def _write(ctx: runlane.RunContext, call: ToolCall, about: dict[str, Any]) -> Any:
    """The effect, recorded once per run; the external API gets an
    idempotency key for the gap between sending and recording."""
    key = f"write:{about['call_id']}"

    async def send() -> dict[str, str]:
        await asyncio.sleep(call.seconds)
        mail_id = await MAILBOX.send(
            call.args["to"], call.args["subject"], idempotency_key=f"{ctx.run_id}:{key}"
        )
        await ctx.emit("effect", {**about, "mail_id": mail_id, "to": call.args["to"]})
        return {"mail_id": mail_id, "to": call.args["to"]}

    receipt: dict[str, str] = await ctx.once(key, send)
    return receipt


def _scripted_failure(ctx: runlane.RunContext, spec: DemoInput, turn: int | None) -> None:
    message = f"scripted failure on attempt {ctx.attempt}"
    if spec.fail_on_turn is not None and turn is not None:
        message += f" at turn {turn}"
    if spec.retry_delay is not None:
        raise runlane.Retry(message, delay=spec.retry_delay)
    raise ScriptedFailure(message)
