"""Run a LangGraph graph as a runlane agent: ``app.langgraph(name, build_graph)``.

``build_graph(checkpointer)`` returns a graph compiled with that checkpointer
(or an uncompiled ``StateGraph``, compiled here with it). Each run of the
agent streams the graph once:

- LangGraph keeps its state with its PostgreSQL checkpointer
  (``AsyncPostgresSaver``, its own tables) in runlane's database; the lane
  is LangGraph's thread (:func:`default_thread_id`).
- Stream output becomes run events: ``token`` (message chunks), ``update``
  (one per node that finished) and ``custom`` (``get_stream_writer()``).
- A graph ``interrupt()`` ends the run ``interrupted`` with its payload; the
  resume run hands the answer to the graph as ``Command(resume=value)``.
- Cancel and steer take effect between steps: before each step the adapter
  calls :meth:`RunContext.safe_point`, except that a steer waits while the
  next step runs a tool node (so that every tool call of a model turn gets
  its answer). Nothing stops a tool node once it runs.
- A retried attempt continues from LangGraph's own checkpoint.

See docs/langgraph.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import datetime
import inspect
import math
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, cast
from urllib.parse import quote
from uuid import UUID

import psycopg
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.errors import GraphRecursionError
from langgraph.graph import StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.pregel import Pregel
from langgraph.types import Command, StreamMode
from psycopg.rows import dict_row
from pydantic import BaseModel

from runlane.context import RunContext
from runlane.database import CONNECT_OPTIONS, resolve_database_url
from runlane.outcomes import BudgetExceeded, Fail, LeaseLost, RunCancelled
from runlane.settings import Settings

# Checkpoint metadata key naming the runlane run that wrote a checkpoint: an
# attempt that finds its own run there continues instead of starting again.
RUN_ID_KEY = "runlane_run_id"
# Advisory lock serialising the checkpointer's table setup ("rl_lgset").
SETUP_LOCK_KEY = 0x726C5F6C67736574
SETUP_WAIT_SECONDS = 60.0
# Stream modes that become events, by default.
DEFAULT_STREAM_MODE: tuple[StreamMode, ...] = ("messages", "updates", "custom")
_EVENT_MODES = frozenset({"messages", "updates", "custom", "values"})

GraphFactory = Callable[[AsyncPostgresSaver], Any]

_current: contextvars.ContextVar[RunContext] = contextvars.ContextVar("runlane_langgraph_run")
# Databases whose checkpointer tables this process has set up.
_set_up: set[str] = set()


def run_context() -> RunContext:
    """The :class:`RunContext` of the run executing the graph, for code inside
    a node or a tool (``await run_context().once(key, effect)``)."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError(
            "run_context() is only available inside a runlane LangGraph run"
        ) from None


async def default_thread_id(ctx: RunContext) -> str:
    """LangGraph's thread for a run: its lane, ``tenant/user/agent/thread``
    (each part URL-quoted), or ``run/<run id>`` for a direct run. A resume
    run reuses the thread of the run it resumes (kept in the checkpoint)."""
    if ctx.thread_id is None:
        return f"run/{ctx.run_id}"
    return "/".join(
        quote(part, safe="") for part in (ctx.tenant, ctx.user_id, ctx.agent, ctx.thread_id)
    )


class LangGraphAgent:
    """The runlane handler that runs a LangGraph graph (see the module doc).

    Options:
        database_url: where LangGraph's checkpointer keeps its tables; by
            default the worker's database (``RUNLANE_DATABASE_URL``, or the
            embedded server).
        stream_mode: the LangGraph stream modes that become events.
        tool_nodes: nodes that run tools, in addition to every ``ToolNode``.
        model_nodes: nodes that call a model (a turn each, for budgets);
            by default every node that is not a tool node.
        input: maps the run's input to the graph's input (default: as is).
        output: maps the graph's final values to the run's output (default:
            the values, as JSON).
        thread_id: ``async (ctx) -> str``, LangGraph's thread for a run.
        config: extra LangGraph config (``recursion_limit``, ``configurable``...).
        interrupt_expires_in: seconds after which an unanswered interrupt ends
            the run ``cancelled``.
    """

    def __init__(
        self,
        build_graph: GraphFactory,
        *,
        settings: Settings | Callable[[], Settings] | None = None,
        database_url: str | None = None,
        stream_mode: Sequence[StreamMode] = DEFAULT_STREAM_MODE,
        tool_nodes: Collection[str] = (),
        model_nodes: Collection[str] | None = None,
        input: Callable[[Any], Any] | None = None,
        output: Callable[[Any], Any] | None = None,
        thread_id: Callable[[RunContext], Awaitable[str]] | None = None,
        config: Mapping[str, Any] | None = None,
        interrupt_expires_in: float | None = None,
    ) -> None:
        unknown = set(stream_mode) - _EVENT_MODES
        if unknown:
            raise ValueError(f"stream modes {sorted(unknown)} cannot become events")
        self.build_graph = build_graph
        self._settings = settings
        self._database_url = database_url
        self.stream_mode = tuple(stream_mode)
        self.tool_nodes = frozenset(tool_nodes)
        self.model_nodes = None if model_nodes is None else frozenset(model_nodes)
        self._input = input
        self._output = output
        self._thread_id = thread_id or default_thread_id
        self._config = dict(config or {})
        self.interrupt_expires_in = interrupt_expires_in

    async def __call__(self, ctx: RunContext) -> Any:
        thread_id = await self._thread_of(ctx)
        config = self._run_config(ctx, thread_id)
        url = await self._url(ctx)
        token = _current.set(ctx)
        try:
            async with await psycopg.AsyncConnection.connect(
                url, autocommit=True, prepare_threshold=0, row_factory=dict_row, **CONNECT_OPTIONS
            ) as conn:
                saver = AsyncPostgresSaver(conn)
                await _setup(saver, conn, url)
                graph = await self._graph(saver)
                tools = self.tool_nodes | _tool_nodes_of(graph)
                graph_input = await self._start_input(graph, config, ctx)
                try:
                    await self._stream(ctx, graph, graph_input, config, tools)
                except GraphRecursionError as exc:
                    # Another attempt would only continue the same loop.
                    raise Fail("graph_recursion_limit", str(exc)) from exc
                state = await graph.aget_state(config)
        finally:
            _current.reset(token)
        if state.interrupts:
            await ctx.interrupt(
                _interrupt_payload(state.interrupts), expires_in=self.interrupt_expires_in
            )
        if state.next:
            raise Fail(
                "graph_paused",
                f"the graph stopped before {list(state.next)} without an interrupt()"
                " (static breakpoints are not supported; call interrupt() in a node)",
            )
        values = state.values
        return self._output(values) if self._output is not None else to_json(values)

    # -- one run ---------------------------------------------------------------

    async def _thread_of(self, ctx: RunContext) -> str:
        """The run's LangGraph thread, kept in its runlane checkpoint so that
        the resume of a direct run finds it."""
        kept = ctx.checkpoint.get("langgraph") if isinstance(ctx.checkpoint, dict) else None
        if isinstance(kept, dict) and isinstance(kept.get("thread_id"), str):
            return str(kept["thread_id"])
        thread_id = await self._thread_id(ctx)
        base = ctx.checkpoint if isinstance(ctx.checkpoint, dict) else {}
        await ctx.save_checkpoint({**base, "langgraph": {"thread_id": thread_id}})
        return thread_id

    def _run_config(self, ctx: RunContext, thread_id: str) -> RunnableConfig:
        extra = self._config
        return cast(
            RunnableConfig,
            {
                **extra,
                "configurable": {**extra.get("configurable", {}), "thread_id": thread_id},
                "metadata": {**extra.get("metadata", {}), RUN_ID_KEY: str(ctx.run_id)},
            },
        )

    async def _url(self, ctx: RunContext) -> str:
        if self._database_url is not None:
            return self._database_url
        from_worker = ctx.database_url
        if isinstance(from_worker, str):
            return from_worker
        source = self._settings
        settings = source if isinstance(source, Settings) else (source or Settings)()
        url = settings.database_url
        if url is None:
            # The embedded server (started already by the worker's process).
            url = await asyncio.to_thread(resolve_database_url, settings, apply_migrations=False)
        self._database_url = url
        return url

    async def _graph(self, saver: AsyncPostgresSaver) -> Pregel[Any, Any, Any, Any]:
        built = self.build_graph(saver)
        if inspect.isawaitable(built):
            built = await built
        if isinstance(built, StateGraph):
            built = built.compile(checkpointer=saver)
        if not isinstance(built, Pregel):
            raise Fail("invalid_graph", f"build_graph returned {type(built).__name__}, not a graph")
        if built.checkpointer is not saver:
            raise Fail("invalid_graph", "compile the graph with the checkpointer build_graph gets")
        return built

    async def _start_input(
        self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, ctx: RunContext
    ) -> Any:
        """None (continue) when an earlier attempt of this run got as far as a
        checkpoint; else the resume command or the run's input."""
        latest = await graph.aget_state(config)
        if (latest.metadata or {}).get(RUN_ID_KEY) == str(ctx.run_id):
            return None
        if ctx.kind == "resume":
            return Command(resume=ctx.resume_value)
        return self._input(ctx.input) if self._input is not None else ctx.input

    async def _stream(
        self,
        ctx: RunContext,
        graph: Pregel[Any, Any, Any, Any],
        graph_input: Any,
        config: RunnableConfig,
        tools: frozenset[str],
    ) -> None:
        # "checkpoints" marks each step before its nodes start: the safe point.
        modes: list[StreamMode] = ["checkpoints", *self.stream_mode]
        stream = cast(
            AsyncGenerator[tuple[str, Any], None],
            graph.astream(graph_input, config, stream_mode=modes, durability="sync"),
        )
        async with contextlib.aclosing(stream):
            async for mode, chunk in stream:
                if mode == "checkpoints":
                    await self._before_step(ctx, list(chunk["next"]), tools)
                elif mode == "messages":
                    await self._message(ctx, chunk, tools)
                elif mode == "updates":
                    for node, update in chunk.items():
                        if node != "__interrupt__":
                            await ctx.emit("update", {"node": node, "update": to_json(update)})
                elif mode == "custom":
                    await ctx.emit("custom", to_json(chunk))
                elif mode == "values":
                    await ctx.emit("values", to_json(chunk))

    async def _before_step(self, ctx: RunContext, nodes: list[str], tools: frozenset[str]) -> None:
        """Between steps, before ``nodes`` start: stop here if the run must."""
        if not nodes:
            return
        if any(node in tools for node in nodes):
            # A steer waits until the tool calls are answered; the rest stops here.
            await _safe_point_but_steer(ctx)
            return
        await ctx.safe_point()
        for node in nodes:
            if self._is_model_node(node, tools):
                await ctx.turn()  # one model call, counted against budget.max_turns

    def _is_model_node(self, node: str, tools: frozenset[str]) -> bool:
        if self.model_nodes is not None:
            return node in self.model_nodes
        return node not in tools and not node.startswith("__")

    async def _message(self, ctx: RunContext, chunk: Any, tools: frozenset[str]) -> None:
        message, metadata = chunk
        node = metadata.get("langgraph_node") if isinstance(metadata, dict) else None
        if not isinstance(message, AIMessageChunk):
            return  # whole messages arrive with the node's update
        if ctx.cancel_requested and node not in tools:
            # A model's answer may stop mid-stream; a tool never does.
            raise RunCancelled(f"run {ctx.run_id}: cancel requested")
        text = message_text(message)
        if text:
            await ctx.emit("token", {"text": text, "node": node})


async def _safe_point_but_steer(ctx: RunContext) -> None:
    if not ctx.steer_requested:
        await ctx.safe_point()
        return
    if ctx.lease_lost:
        raise LeaseLost(f"run {ctx.run_id}: lease lost")
    if ctx.cancel_requested:
        raise RunCancelled(f"run {ctx.run_id}: cancel requested")
    left = ctx.seconds_left
    if left is not None and left <= 0:
        raise BudgetExceeded("max_seconds")


async def _setup(saver: AsyncPostgresSaver, conn: psycopg.AsyncConnection[Any], url: str) -> None:
    """Creates or migrates the checkpointer's tables, once per database and
    process, under an advisory lock so that concurrent workers take turns.

    The lock is polled: its setup builds indexes CONCURRENTLY, which waits
    for every open transaction, including a session blocked on the lock."""
    if url in _set_up:
        return
    deadline = time.monotonic() + SETUP_WAIT_SECONDS
    while True:
        cursor = await conn.execute("SELECT pg_try_advisory_lock(%s) AS locked", (SETUP_LOCK_KEY,))
        row = await cursor.fetchone()
        if row is not None and row["locked"]:
            break
        if time.monotonic() > deadline:
            raise TimeoutError("another process is still setting up LangGraph's tables")
        await asyncio.sleep(0.05)
    try:
        await saver.setup()
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (SETUP_LOCK_KEY,))
    _set_up.add(url)


def _tool_nodes_of(graph: Pregel[Any, Any, Any, Any]) -> frozenset[str]:
    return frozenset(name for name, node in graph.nodes.items() if isinstance(node.bound, ToolNode))


def _interrupt_payload(interrupts: Sequence[Any]) -> Any:
    """One interrupt: its value. Several (parallel nodes): all of them; the
    answer is then a mapping of interrupt id to value."""
    if len(interrupts) == 1:
        return to_json(interrupts[0].value)
    return {"interrupts": [{"id": i.id, "value": to_json(i.value)} for i in interrupts]}


# -- JSON for events and outputs ------------------------------------------------


def message_text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return "".join(parts)


def to_json(value: Any, _depth: int = 0) -> Any:
    """``value`` as JSON that PostgreSQL's jsonb accepts: messages in a compact
    form, models and dataclasses as objects, anything else as its string."""
    if _depth > 64:
        return "..."
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return value.replace("\x00", "")
    deeper = _depth + 1
    if isinstance(value, BaseMessage):
        return _message_json(value, deeper)
    if isinstance(value, Mapping):
        return {str(key).replace("\x00", ""): to_json(item, deeper) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_json(item, deeper) for item in value]
    if isinstance(value, BaseModel):
        return to_json(value.model_dump(mode="json"), deeper)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name), deeper) for f in dataclasses.fields(value)}
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    return str(value).replace("\x00", "")


def _message_json(message: BaseMessage, depth: int) -> dict[str, Any]:
    data: dict[str, Any] = {"type": message.type, "content": to_json(message.content, depth)}
    if message.id is not None:
        data["id"] = message.id
    if message.name is not None:
        data["name"] = message.name
    if isinstance(message, AIMessage) and message.tool_calls:
        data["tool_calls"] = [
            {"id": call.get("id"), "name": call["name"], "args": to_json(call["args"], depth)}
            for call in message.tool_calls
        ]
    if isinstance(message, ToolMessage):
        data["tool_call_id"] = message.tool_call_id
    return data
