"""The examples run as their README says, one command each, here against the
test's database (RUNLANE_DATABASE_URL) instead of the embedded server."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str, db_url: str) -> str:
    env = {**os.environ, "RUNLANE_DATABASE_URL": db_url}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def runs_of(sql: psycopg.Connection[Any], agent: str) -> list[tuple[str, str]]:
    return sql.execute(
        "SELECT kind, status FROM runlane.runs WHERE agent = %s ORDER BY created_at",
        (agent,),
    ).fetchall()


def test_the_plain_agent_example(db_url: str, sql: psycopg.Connection[Any]) -> None:
    out = run_example("plain_agent.py", db_url)
    lines = out.splitlines()

    assert re.match(r"submitted a request into thread 'example-\w+': run \w{8}$", lines[0])
    expected = [
        "  model: Let me look up order 1042.",
        "  tool call: look_up_order(order_id='1042')",
        "  model: The parcel was lost in transit. I can refund the 25.00 EUR.",
        "  tool call: refund(amount='25.00 EUR', order_id='1042')",
        "the agent asks: Refund 25.00 EUR for order 1042?",
        "answering: approve",
        "  model: All set: the refund is on its way. Anything else?",
        "final answer: All set: the refund is on its way. Anything else?",
    ]
    assert [line for line in lines if line in expected] == expected, out
    # What the tools returned: the lookup before the question, the refund
    # after the answer.
    results = [
        (line.split()[2], json.loads(line.split(" -> ", 1)[1]))
        for line in lines
        if line.startswith("  tool result: ")
    ]
    assert results == [
        ("look_up_order", {"order_id": "1042", "paid": "25.00 EUR", "status": "lost in transit"}),
        ("refund", {"order_id": "1042", "amount": "25.00 EUR", "refund_id": ANY}),
    ], out
    assert re.search(r"^run \w{8}: interrupted$", out, re.MULTILINE), out
    assert re.search(r"^run \w{8}: completed$", out, re.MULTILINE), out

    assert runs_of(sql, "support-bot") == [("request", "interrupted"), ("resume", "completed")]
    # The refund went through ctx.once, in the resumed run.
    effects = sql.execute(
        "SELECT r.kind, e.key FROM runlane.run_effects e JOIN runlane.runs r ON r.id = e.run_id"
    ).fetchall()
    assert effects == [("resume", "refund:1042")]


@pytest.mark.skipif(
    importlib.util.find_spec("langgraph") is None, reason="pip install runlane[langgraph]"
)
def test_the_langgraph_example(db_url: str, sql: psycopg.Connection[Any]) -> None:
    out = run_example("langgraph_agent.py", db_url)

    assert re.search(r"^submitted a request into thread 'example-\w+'", out, re.MULTILINE), out
    assert "  [agent] I will mail the quarterly report to Bob." in out
    assert "the agent asks: Send the quarterly report to bob?" in out
    assert "answering: approve" in out
    assert "final answer: Done: the report is on its way to Bob." in out
    assert re.search(r"^run \w{8} \(request\): interrupted$", out, re.MULTILINE), out
    assert re.search(r"^run \w{8} \(resume\): completed$", out, re.MULTILINE), out

    assert runs_of(sql, "mail-agent") == [("request", "interrupted"), ("resume", "completed")]
