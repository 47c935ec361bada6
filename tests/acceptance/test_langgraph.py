"""The LangGraph adapter end to end: a real worker, real PostgreSQL (runlane's
and LangGraph's checkpointer in the same database), langchain-core's fake chat
model scripted to stream tokens and call tools."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import math
import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

import psycopg
import pytest
from pydantic import Field

pytest.importorskip("langgraph")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt

import runlane
from runlane import App
from runlane.execution import json_problem
from runlane.lane_service import LaneService
from runlane.lanes import RequestStatus
from runlane.langgraph_agent import run_context, to_json
from runlane.models import Run, RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from tests.integration.lane_helpers import TENANT, USER
from tests.support import running_worker, wait_until

ROOT = Path(__file__).resolve().parents[2]


# -- a scripted streaming model, and a model <-> tools graph -------------------


class ScriptedChatModel(GenericFakeChatModel):
    """langchain-core's fake chat model, streaming its scripted messages word
    by word (tool calls included) and noting what each call was shown."""

    token_delay: float = 0.0
    seen: list[list[BaseMessage]] = Field(default_factory=list)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        self.seen.append(list(messages))
        message = next(self.messages)
        assert isinstance(message, AIMessage)
        for token in re.findall(r"\s*\S+", str(message.content)):
            await asyncio.sleep(self.token_delay)
            yield ChatGenerationChunk(message=AIMessageChunk(content=token, id=message.id))
        if message.tool_calls:
            chunks = [
                tool_call_chunk(name=c["name"], args=json.dumps(c["args"]), id=c["id"], index=i)
                for i, c in enumerate(message.tool_calls)
            ]
            yield ChatGenerationChunk(
                message=AIMessageChunk(content="", id=message.id, tool_call_chunks=chunks)
            )


def says(text: str, *calls: tuple[str, dict[str, Any]]) -> AIMessage:
    return AIMessage(
        content=text,
        tool_calls=[
            {"name": name, "args": args, "id": f"call-{name}-{i}"}
            for i, (name, args) in enumerate(calls)
        ],
    )


def model_of(*script: AIMessage, token_delay: float = 0.0) -> ScriptedChatModel:
    return ScriptedChatModel(messages=iter(script), token_delay=token_delay)


def model_and_tools(
    model: ScriptedChatModel, tools: Iterable[Any], *, compiled: bool = True
) -> Callable[[AsyncPostgresSaver], Any]:
    """build_graph: the two-node agent loop (model <-> tools)."""

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(list(tools)))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    if not compiled:
        return lambda checkpointer: builder
    return lambda checkpointer: builder.compile(checkpointer=checkpointer)


def user_says(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


# -- helpers -------------------------------------------------------------------


async def submit(lanes: LaneService, agent: str, thread: str, payload: Any, **kw: Any) -> Any:
    request, _ = await lanes.submit(
        tenant=TENANT, user_id=USER, agent=agent, thread_id=thread, input=payload, **kw
    )
    return request


async def run_of(lanes: LaneService, request_id: str) -> Any:
    request = await lanes.get_request(tenant=TENANT, request_id=request_id)
    return request.run_id if request.status is RequestStatus.DISPATCHED else None


async def ended(service: RunService, run_id: Any, timeout: float = 20) -> Run:
    async def terminal() -> Run | None:
        run = await service.get(run_id)
        return run if run.status.is_terminal else None

    run = await wait_until(terminal, timeout=timeout, message=f"run {run_id} to end")
    assert run is not None
    return run


def events(sql: psycopg.Connection[Any], run_id: Any, kind: str | None = None) -> list[Any]:
    rows = sql.execute(
        "SELECT kind, data, attempt FROM runlane.run_events WHERE run_id = %s ORDER BY seq",
        (run_id,),
    ).fetchall()
    return [(k, d, a) for k, d, a in rows if kind is None or k == kind]


def streamed_text(sql: psycopg.Connection[Any], run_id: Any) -> str:
    return "".join(data["text"] for _, data, _ in events(sql, run_id, "token"))


def updated_nodes(sql: psycopg.Connection[Any], run_id: Any) -> list[str]:
    return [data["node"] for _, data, _ in events(sql, run_id, "update")]


async def graph_state(db_url: str, build: Callable[[Any], Any], thread_id: str) -> Any:
    """LangGraph's own view of a thread, read with a fresh checkpointer."""
    async with AsyncPostgresSaver.from_conn_string(db_url) as saver:
        graph = build(saver)
        return await graph.aget_state({"configurable": {"thread_id": thread_id}})


def lane_thread(agent: str, thread: str) -> str:
    return f"{TENANT}/{USER}/{agent}/{thread}"


# -- interrupt, resume, tokens ---------------------------------------------------


async def test_a_tool_needing_approval_interrupts_and_the_resume_completes(
    lanes: LaneService, service: RunService, settings: Settings, sql: Any, db_url: str
) -> None:
    sent: list[str] = []

    @tool
    async def send_mail(to: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Sends the report by mail, once a human approves."""
        answer = interrupt({"ask": "send the report?", "to": to})
        if not answer.get("approved"):
            return "not sent"

        def send() -> str:
            sent.append(to)
            return f"sent to {to}"

        # An effect recorded once per run, keyed by the (checkpointed) call id.
        return str(await run_context().once(f"send-mail:{tool_call_id}", send))

    model = model_of(
        says("I will mail Bob the report.", ("send_mail", {"to": "bob"})),
        says("Done: the report is on its way to Bob."),
    )
    build = model_and_tools(model, [send_mail])
    app = App(settings)
    app.langgraph("mailer", build)

    request = await submit(lanes, "mailer", "t-1", user_says("Mail Bob the report"))
    async with running_worker(app, settings):
        first = await ended(service, request.run_id)
        assert first.status is RunStatus.INTERRUPTED, first.error
        assert first.interrupt == {"ask": "send the report?", "to": "bob"}
        assert sent == []
        # The model's tokens were streamed as events, then its node's update.
        assert streamed_text(sql, first.id) == "I will mail Bob the report."
        assert [data["node"] for _, data, _ in events(sql, first.id, "token")] == ["agent"] * 6
        assert updated_nodes(sql, first.id) == ["agent"]
        (_, update, _) = events(sql, first.id, "update")[0]
        assert update["update"]["messages"][0]["tool_calls"] == [
            {"id": "call-send_mail-0", "name": "send_mail", "args": {"to": "bob"}}
        ]

        resume, _ = await lanes.resume(first.id, {"approved": True})
        done = await ended(service, resume.id)

    assert done.status is RunStatus.COMPLETED, done.error
    assert sent == ["bob"]
    assert updated_nodes(sql, done.id) == ["tools", "agent"]
    assert streamed_text(sql, done.id) == "Done: the report is on its way to Bob."
    messages = done.output["messages"]
    assert [m["type"] for m in messages] == ["human", "ai", "tool", "ai"]
    assert messages[2]["content"] == "sent to bob"
    assert messages[3]["content"] == "Done: the report is on its way to Bob."
    # Both runs used one LangGraph thread, named after the lane, kept in
    # LangGraph's own tables in runlane's database.
    thread = lane_thread("mailer", "t-1")
    assert first.checkpoint == {"langgraph": {"thread_id": thread}}
    assert done.checkpoint == first.checkpoint
    stored = sql.execute(
        "SELECT count(*) FROM checkpoints WHERE thread_id = %s", (thread,)
    ).fetchone()
    assert stored is not None and stored[0] >= 4
    state = await graph_state(db_url, build, thread)
    assert state.next == () and len(state.values["messages"]) == 4
    effects = sql.execute(
        "SELECT key FROM runlane.run_effects WHERE run_id = %s", (done.id,)
    ).fetchall()
    assert effects == [("send-mail:call-send_mail-0",)]


async def test_a_direct_run_resumes_on_its_own_thread(
    service: RunService, lanes: LaneService, settings: Settings
) -> None:
    @tool
    def delete_file(path: str) -> str:
        """Deletes a file, if a human agrees."""
        return "deleted" if interrupt({"delete": path}) == "yes" else "kept"

    model = model_of(says("Deleting.", ("delete_file", {"path": "/tmp/x"})), says("Gone."))
    app = App(settings)
    # An uncompiled StateGraph is compiled with the checkpointer.
    app.langgraph("janitor", model_and_tools(model, [delete_file], compiled=False))

    run, _ = await service.submit("janitor", user_says("delete /tmp/x"))
    async with running_worker(app, settings):
        first = await ended(service, run.id)
        assert first.status is RunStatus.INTERRUPTED, first.error
        assert first.interrupt == {"delete": "/tmp/x"}
        resume, _ = await lanes.resume(first.id, "yes")
        done = await ended(service, resume.id)
    assert done.status is RunStatus.COMPLETED, done.error
    assert [m["content"] for m in done.output["messages"][-2:]] == ["deleted", "Gone."]
    # The resume run (a new run id) found the first run's thread in its checkpoint.
    assert done.checkpoint == {"langgraph": {"thread_id": f"run/{run.id}"}}


# -- cancel and steer between nodes ------------------------------------------------


async def test_cancel_takes_effect_after_the_running_tool_node_not_inside_it(
    lanes: LaneService, service: RunService, settings: Settings, sql: Any, db_url: str
) -> None:
    started = asyncio.Event()
    log: list[str] = []

    @tool
    async def slow_lookup(query: str) -> str:
        """A slow search."""
        log.append("start")
        started.set()
        await asyncio.sleep(2.0)
        log.append("end")
        return f"results for {query}"

    model = model_of(says("Searching.", ("slow_lookup", {"query": "q"})), says("Never said."))
    build = model_and_tools(model, [slow_lookup])
    app = App(settings)
    app.langgraph("searcher", build)

    request = await submit(lanes, "searcher", "t-c", user_says("search q"))
    async with running_worker(app, settings):
        await asyncio.wait_for(started.wait(), 20)
        cancelling = await lanes.cancel_run(request.run_id)
        assert cancelling.status is RunStatus.CANCEL_REQUESTED
        assert log == ["start"]
        run = await ended(service, request.run_id)

    assert run.status is RunStatus.CANCELLED
    # The tool ran to its end; the next model call never started.
    assert log == ["start", "end"]
    assert len(model.seen) == 1
    assert updated_nodes(sql, run.id) == ["agent", "tools"]
    # LangGraph's checkpoint holds the tool's answer, waiting before "agent".
    state = await graph_state(db_url, build, lane_thread("searcher", "t-c"))
    assert state.next == ("agent",)
    assert state.values["messages"][-1].content == "results for q"


async def test_cancel_stops_a_streaming_model_mid_answer(
    lanes: LaneService, service: RunService, settings: Settings, sql: Any
) -> None:
    words = " ".join(f"word{i}" for i in range(200))
    model = model_of(says(words), token_delay=0.02)
    app = App(settings)
    app.langgraph("talker", model_and_tools(model, []))

    request = await submit(lanes, "talker", "t-m", user_says("talk"))
    async with running_worker(app, settings):
        await wait_until(
            lambda: len(events(sql, request.run_id, "token")) >= 3, message="first tokens"
        )
        await lanes.cancel_run(request.run_id)
        run = await ended(service, request.run_id)
    assert run.status is RunStatus.CANCELLED
    assert 3 <= len(events(sql, run.id, "token")) < 200


async def test_a_steer_ends_the_run_before_its_next_model_call(
    lanes: LaneService, service: RunService, settings: Settings, sql: Any
) -> None:
    started = asyncio.Event()
    log: list[str] = []

    @tool
    async def slow_lookup(query: str) -> str:
        """A slow search."""
        log.append("start")
        started.set()
        await asyncio.sleep(1.5)
        log.append("end")
        return f"results for {query}"

    model = model_of(
        says("Searching.", ("slow_lookup", {"query": "flights"})),
        says("Here is the answer to your new question."),
    )
    app = App(settings)
    app.langgraph("planner", model_and_tools(model, [slow_lookup]))

    first = await submit(lanes, "planner", "t-s", user_says("find flights"))
    async with running_worker(app, settings):
        await asyncio.wait_for(started.wait(), 20)
        steer = await submit(lanes, "planner", "t-s", user_says("hotels instead"), policy="steer")
        assert steer.status is RequestStatus.QUEUED
        steered = await ended(service, first.run_id)
        assert (steered.status, steered.outcome) == (RunStatus.COMPLETED, "steered")
        # The tool finished; the model was not called again by the steered
        # run. A later call is the steer's own run, which may already have
        # started (it is claimed in the transaction that ended this one).
        assert log == ["start", "end"]
        assert all(any(m.content == "hotels instead" for m in call) for call in model.seen[1:])
        assert updated_nodes(sql, steered.id) == ["agent", "tools"]

        steer_run_id = await wait_until(lambda: run_of(lanes, steer.request_id), message="steer")
        answered = await ended(service, steer_run_id)

    assert answered.status is RunStatus.COMPLETED, answered.error
    # The steer's model call saw the whole thread: the tool's answer, then the steer.
    shown = [(m.type, m.content) for m in model.seen[1]]
    assert shown == [
        ("human", "find flights"),
        ("ai", "Searching."),
        ("tool", "results for flights"),
        ("human", "hotels instead"),
    ]
    assert streamed_text(sql, answered.id) == "Here is the answer to your new question."


# -- retries continue from LangGraph's checkpoint ------------------------------------


async def test_a_retried_attempt_continues_from_the_graph_checkpoint(
    service: RunService, settings: Settings, sql: Any
) -> None:
    calls: list[int] = []

    @tool
    def flaky_lookup(query: str) -> str:
        """Fails the first time."""
        calls.append(len(calls) + 1)
        if len(calls) == 1:
            raise runlane.Retry("lookup flaked", delay=0)
        return f"found {query}"

    model = model_of(says("Looking.", ("flaky_lookup", {"query": "x"})), says("Found it."))
    app = App(settings)
    app.langgraph("looker", model_and_tools(model, [flaky_lookup]))

    run, _ = await service.submit("looker", user_says("look up x"), max_attempts=3)
    async with running_worker(app, settings):
        done = await ended(service, run.id)

    assert done.status is RunStatus.COMPLETED, done.error
    assert done.attempts == 2 and calls == [1, 2]
    # Attempt 2 started at the tool node: the first model turn was not redone.
    assert len(model.seen) == 2
    by_attempt = [(data["node"], attempt) for _, data, attempt in events(sql, run.id, "update")]
    assert by_attempt == [("agent", 1), ("tools", 2), ("agent", 2)]
    assert [m["type"] for m in done.output["messages"]] == ["human", "ai", "tool", "ai"]
    # The tool's runlane.Retry reached the worker as itself (no backoff).
    outcomes = sql.execute(
        "SELECT outcome, error->>'code' FROM runlane.attempts WHERE run_id = %s ORDER BY attempt",
        (run.id,),
    ).fetchall()
    assert outcomes == [("retry", "retry_requested"), ("completed", None)]


async def test_fail_in_a_node_and_a_runaway_loop_end_the_run_failed_without_retry(
    service: RunService, settings: Settings
) -> None:
    @tool
    def refuse(reason: str) -> str:
        """Gives up for good."""
        raise runlane.Fail("refused", reason)

    @tool
    def again() -> str:
        """Asks for another round."""
        return "go on"

    looping = model_of(*[says("Again.", ("again", {})) for _ in range(10)])
    app = App(settings)
    app.langgraph(
        "refuser", model_and_tools(model_of(says("No.", ("refuse", {"reason": "r"}))), [refuse])
    )
    app.langgraph("looper", model_and_tools(looping, [again]), config={"recursion_limit": 4})

    refused, _ = await service.submit("refuser", user_says("go"), max_attempts=3)
    runaway, _ = await service.submit("looper", user_says("go"), max_attempts=3)
    async with running_worker(app, settings):
        refused_run = await ended(service, refused.id)
        runaway_run = await ended(service, runaway.id)
    assert (refused_run.status, refused_run.attempts) == (RunStatus.FAILED, 1)
    assert refused_run.error == {"code": "refused", "message": "r"}
    assert (runaway_run.status, runaway_run.attempts) == (RunStatus.FAILED, 1)
    assert runaway_run.error is not None
    assert runaway_run.error["code"] == "graph_recursion_limit"


async def test_each_model_step_is_a_turn_of_the_budget(
    service: RunService, settings: Settings, sql: Any
) -> None:
    looked: list[str] = []

    @tool
    def lookup(query: str) -> str:
        """Looks something up."""
        looked.append(query)
        return "found"

    model = model_of(says("Looking.", ("lookup", {"query": "q"})), says("Never said."))
    app = App(settings)
    app.langgraph("counted", model_and_tools(model, [lookup]))

    run, _ = await service.submit(
        "counted", user_says("go"), budget={"max_turns": 1}, max_attempts=3
    )
    async with running_worker(app, settings):
        done = await ended(service, run.id)
    # Turn 1 (the model), the tool, then turn 2 is over the budget: no retry.
    assert (done.status, done.attempts) == (RunStatus.FAILED, 1)
    assert done.error is not None and done.error["code"] == "budget_exceeded"
    assert looked == ["q"] and len(model.seen) == 1


def test_graph_values_become_json_that_postgresql_stores() -> None:
    @dataclasses.dataclass
    class Point:
        x: float
        label: str

    value = {
        "messages": [says("hi\x00", ("t", {"n": math.nan}))],
        "point": Point(math.inf, "a"),
        "when": datetime.date(2024, 1, 2),
        "ids": (uuid.UUID(int=1),),
        7: {"nested": object},
    }
    assert to_json(value) == {
        "messages": [
            {
                "type": "ai",
                "content": "hi",
                "tool_calls": [{"id": "call-t-0", "name": "t", "args": {"n": "nan"}}],
            }
        ],
        "point": {"x": "inf", "label": "a"},
        "when": "2024-01-02",
        "ids": ["00000000-0000-0000-0000-000000000001"],
        "7": {"nested": "<class 'object'>"},
    }
    assert json_problem(to_json(value)) is None


# -- the example -------------------------------------------------------------------


def test_the_example_runs_against_the_given_database(db_url: str) -> None:
    env = {**os.environ, "RUNLANE_DATABASE_URL": db_url}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "langgraph_agent.py")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "interrupted" in out and "completed" in out
    assert "approve" in out.lower()
