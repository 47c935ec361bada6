"""A LangGraph agent on runlane, in one command:

    python examples/langgraph_agent.py

It uses RUNLANE_DATABASE_URL, or starts runlane's embedded PostgreSQL, runs a
worker in this process and submits a request into a thread. The agent is a
two-node LangGraph graph (model <-> tools) whose mail tool asks a human for
approval with LangGraph's ``interrupt()``. The run ends ``interrupted``; this
script answers the question (a runlane resume), and the graph finishes on the
same LangGraph thread. Every event the runs stream is printed.

No network: the model is langchain-core's fake chat model, scripted to stream
its answer word by word and to call the tool. Needs
``pip install runlane[langgraph]``.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt

import runlane
from runlane.database import resolve_database_url
from runlane.lane_service import LaneService
from runlane.lane_store import LaneStore
from runlane.models import Event, Run, RunStatus
from runlane.service import RunService
from runlane.worker import Worker

AGENT = "mail-agent"


# -- the agent: a LangGraph graph ------------------------------------------------


class StreamingFakeModel(GenericFakeChatModel):
    """langchain-core's fake chat model, streaming each scripted message word
    by word, tool calls included, like a real chat model would."""

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        message = next(self.messages)
        assert isinstance(message, AIMessage)
        for word in re.findall(r"\s*\S+", str(message.content)):
            await asyncio.sleep(0.03)
            yield ChatGenerationChunk(message=AIMessageChunk(content=word, id=message.id))
        calls = [
            tool_call_chunk(name=c["name"], args=json.dumps(c["args"]), id=c["id"], index=i)
            for i, c in enumerate(message.tool_calls)
        ]
        if calls:
            yield ChatGenerationChunk(
                message=AIMessageChunk(content="", id=message.id, tool_call_chunks=calls)
            )


model = StreamingFakeModel(
    messages=iter(
        [
            AIMessage(
                content="I will mail the quarterly report to Bob.",
                tool_calls=[{"name": "send_report", "args": {"to": "bob"}, "id": "call-1"}],
            ),
            AIMessage(content="Done: the report is on its way to Bob."),
        ]
    )
)


@tool
def send_report(to: str) -> str:
    """Mails the quarterly report, once a human approves."""
    answer = interrupt({"question": f"Send the quarterly report to {to}?", "to": to})
    if not isinstance(answer, dict) or not answer.get("approved"):
        return "not sent: the human said no"
    return f"report sent to {to}"


async def call_model(state: MessagesState) -> dict[str, Any]:
    return {"messages": [await model.ainvoke(state["messages"])]}


def build_graph(checkpointer: Any) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", call_model)
    builder.add_node("tools", ToolNode([send_report]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


app = runlane.App()
app.langgraph(AGENT, build_graph)


# -- the client side: submit, watch, approve -------------------------------------


async def watch(service: RunService, run_id: Any, timeout: float = 60) -> Run:
    """Prints the run's events as they come; returns the run once it ends
    (or as it is after ``timeout`` seconds)."""
    try:
        async with asyncio.timeout(timeout):
            return await _print_events(service, run_id)
    except TimeoutError:
        run = await service.get(run_id)
        print(f"\nstill {run.status} after {timeout:g}s: run {run.id}")
        return run


async def _print_events(service: RunService, run_id: Any) -> Run:
    streaming = False
    async for item in service.follow(run_id, poll_seconds=0.05):
        if isinstance(item, Run):
            if streaming:
                print()
            print(f"run {str(item.id)[:8]} ({item.kind}): {item.status}")
            return item
        assert isinstance(item, Event)
        if item.kind == "token":
            if not streaming:
                print(f"  [{item.data['node']}] ", end="")
                streaming = True
            print(item.data["text"], end="", flush=True)
            continue
        if streaming:
            print()
            streaming = False
        if item.kind == "update":
            for message in item.data["update"].get("messages", []):
                calls = ", ".join(
                    f"{c['name']}({json.dumps(c['args'])})" for c in message.get("tool_calls", [])
                )
                said = f" calls {calls}" if calls else f": {message['content']}"
                print(f"  update from {item.data['node']}: {message['type']}{said}")
        else:
            print(f"  {item.kind}: {json.dumps(item.data)}")
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
            input={"messages": [{"role": "user", "content": "Mail Bob the quarterly report"}]},
        )
        assert request.run_id is not None, "a new thread starts its request at once"
        print(f"submitted a request into thread {thread!r}: run {str(request.run_id)[:8]}")

        run = await watch(service, request.run_id)
        if run.status is not RunStatus.INTERRUPTED:
            print(f"expected the run to wait for approval; it ended {run.status}: {run.error}")
            return 1
        print(f"the agent asks: {run.interrupt['question']}")
        print("answering: approve")
        resume, _ = await lanes.resume(run.id, {"approved": True})

        done = await watch(service, resume.id)
        if done.status is not RunStatus.COMPLETED:
            print(f"expected the resumed run to complete; it ended {done.status}: {done.error}")
            return 1
        answer = done.output["messages"][-1]["content"]
        print(f"final answer: {answer}")
        return 0
    finally:
        await worker.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
