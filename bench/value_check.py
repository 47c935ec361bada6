"""What checking a JSON value costs: ``json_problem``, which every submit
runs on its input and metadata and every worker on each handler's output,
against ``json.dumps`` of the same value (to text, as psycopg sends it);
and a submit's serialization of its input, as psycopg's binary jsonb
parameter, made twice (the size check's ``json.dumps``, then psycopg's
own of the value: ``Jsonb``) and once (the size check's text handed to
psycopg: ``runlane.database.jsonb_param``).

    python -m bench.value_check [--turns 10,100,1000] [--src OTHER_CHECKOUT/src]
                                [--repeat 7] [--number 50] [--tag _s37] [--out-dir DIR]

The values are shaped like an agent's transcript: ``--turns`` messages,
each an object with a role, a short text with non-ASCII letters, an
integer, a float and a null. Each time is the best of ``--repeat``
batches of ``--number`` calls, in this process (CPU-bound, no database).
With ``--src``, the other checkout's ``runlane/json_values.py`` is timed
on the same values in the same batches, alternating. Results:
``bench/results/value_check{tag}.json``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import timeit
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from psycopg.abc import Buffer
from psycopg.adapt import PyFormat, Transformer
from psycopg.types.json import Jsonb

from bench.common import ROOT, print_table, write_results
from runlane.database import jsonb_param

_TRANSFORMER = Transformer()


def as_parameter(value: Any) -> Buffer:
    """``value`` (a Jsonb) as psycopg sends it, in binary."""
    return _TRANSFORMER.get_dumper(value, PyFormat.BINARY).dump(value)


def serialized_twice(value: Any) -> Buffer:
    len(json.dumps(value, ensure_ascii=False).encode())
    return as_parameter(Jsonb(value))


def serialized_once(value: Any) -> Buffer:
    encoded = json.dumps(value, ensure_ascii=False).encode()
    len(encoded)
    return as_parameter(jsonb_param(value, encoded))


def transcript(turns: int) -> dict[str, Any]:
    messages = [
        {
            "role": "user" if i % 2 else "assistant",
            "content": f"message {i}: some text with letters like é and ü",
            "tokens": i,
            "score": i / 3,
            "tool": None,
        }
        for i in range(turns)
    ]
    return {"messages": messages, "config": {"model": "m", "temperature": 0.2}}


def load_checker(src: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, src / "runlane" / "json_values.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def best_us(call: Callable[[], object], repeat: int, number: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6


def run(
    turns: list[int],
    *,
    src: str | None = None,
    repeat: int = 7,
    number: int = 50,
    tag: str = "",
    out_dir: Path | None = None,
) -> dict[str, Any]:
    checkers = {"this checkout": load_checker(ROOT / "src", "value_check_this")}
    if src:
        checkers["--src"] = load_checker(Path(src), "value_check_other")
    rows: list[dict[str, Any]] = []
    for count in turns:
        value = transcript(count)
        row: dict[str, Any] = {
            "turns": count,
            "bytes": len(json.dumps(value, ensure_ascii=False).encode()),
        }
        for code, checker in checkers.items():
            assert checker.json_problem(value) is None
            row[f"json_problem_us {code}"] = best_us(
                functools.partial(checker.json_problem, value), repeat, number
            )
        row["json_dumps_us"] = best_us(
            functools.partial(json.dumps, value, ensure_ascii=False), repeat, number
        )
        for way, serialize in (("twice", serialized_twice), ("once", serialized_once)):
            row[f"serialized_{way}_us"] = best_us(
                functools.partial(serialize, value), repeat, number
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    headers = [
        "turns",
        "bytes",
        *(f"json_problem µs, {code}" for code in checkers),
        "json.dumps µs",
        "a submit's serialization µs, twice (before)",
        "once",
    ]
    table = print_table(
        headers,
        [
            [
                row["turns"],
                row["bytes"],
                *(row[f"json_problem_us {code}"] for code in checkers),
                row["json_dumps_us"],
                row["serialized_twice_us"],
                row["serialized_once_us"],
            ]
            for row in rows
        ],
    )
    data = {"src": src, "repeat": repeat, "number": number, "rows": rows, "table": table}
    write_results(f"value_check{tag}", data, out_dir=out_dir)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.value_check")
    parser.add_argument("--turns", default="10,100,1000")
    parser.add_argument("--src", default=None)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=50)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    run(
        [int(t) for t in args.turns.split(",")],
        src=args.src,
        repeat=args.repeat,
        number=args.number,
        tag=args.tag,
        out_dir=args.out_dir,
    )


if __name__ == "__main__":
    main()
