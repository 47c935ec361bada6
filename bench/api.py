"""Figure 6: the HTTP API — submits per second through
``POST /v1/threads/{t}/requests`` on idle lanes, p50/p99; and SSE: S
subscribers on R runs (``GET /v1/runs/{id}/events``), event delivery p99.

One uvicorn process serves ``runlane.api.create_app`` (its default pool of
20 connections); a separate load-generator process posts for T seconds over
C keep-alive connections, every request to a new thread (so every lane is
idle and the request is dispatched at once). The generator is wrk (one
thread, ``bench/api_wrk.lua``) when it is on the PATH, else a Python one
(httpx, asyncio), which spends about 3.5 ms of CPU per request and so
saturates a core before the server does. No worker runs during the submit
test.

SSE: R runs are submitted; a subscriber process opens S streams (S/R per
run) and says ``ready`` once every stream answered; then a worker (mode
``events``: E events, one every I s, each carrying ``time.time()``) runs
them. Delivery latency = the subscriber's clock at receipt - the handler's
clock at ``emit``, for every event on every stream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench import runlane_system
from bench.common import (
    AGENT,
    Proc,
    backend_pids,
    bench_database,
    free_port,
    latency_summary,
    median,
    print_table,
    process_cpu_seconds,
    running,
    spawn,
    wait_for,
    write_results,
)

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "seconds": 1,
        "connections": 4,
        "runs": 2,
        "subscribers": 4,
        "events": 2,
        "event_interval": 0.2,
    },
    "small": {
        "seconds": 5,
        "connections": 32,
        "runs": 20,
        "subscribers": 200,
        "events": 3,
        "event_interval": 1.0,
    },
    "full": {
        "seconds": 10,
        "connections": 32,
        "runs": 100,
        "subscribers": 1000,
        "events": 5,
        "event_interval": 1.0,
    },
}
TENANT = "bench"


async def _create_key(url: str) -> str:
    from runlane.database import create_pool
    from runlane.keys import KeyStore

    pool = create_pool(url, min_size=1, max_size=1)
    await pool.open()
    try:
        _, secret = await KeyStore(pool).create(tenant=TENANT, user_id="bench")
    finally:
        await pool.close()
    return secret


async def _submit_runs(url: str, n: int) -> list[str]:
    from runlane.database import create_pool
    from runlane.service import RunService
    from runlane.settings import Settings
    from runlane.store import RunStore

    pool = create_pool(url, min_size=1, max_size=1)
    await pool.open()
    try:
        service = RunService(RunStore(pool), Settings(database_url=url))
        ids = []
        for i in range(n):
            run, _ = await service.submit(AGENT, {"i": i}, tenant=TENANT, user_id="bench")
            ids.append(str(run.id))
    finally:
        await pool.close()
    return ids


def start_server(url: str) -> tuple[Proc, str]:
    port = free_port()
    server = spawn("bench.api", ["serve", "--url", url, "--port", str(port)], name="uvicorn")
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(healthy, timeout=30, interval=0.1, what="the API server")
    return server, base


def last_json(proc: Proc, timeout: float) -> dict[str, Any]:
    out, _ = proc.popen.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{proc.name} printed no result (exit {proc.popen.returncode})")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


WRK_SCRIPT = Path(__file__).with_name("api_wrk.lua")


def wrk_run(base: str, key: str, connections: int, seconds: float) -> dict[str, Any]:
    """One wrk run, in the shape of ``load``'s result (its CPU from the
    kernel's accounting of the finished process)."""
    command = ["wrk", "-t1", f"-c{connections}", f"-d{max(seconds, 1):g}s"]
    command += ["-s", str(WRK_SCRIPT), base, "--", key, uuid.uuid4().hex[:12], AGENT]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    with proc.stdout:
        out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited {proc.returncode}")
    result = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    ok = result["requests"] - result["errors"]
    elapsed = result["duration_us"] / 1e6
    return {
        "ok": ok,
        "errors": result["errors"],
        "seconds": elapsed,
        "per_s": ok / elapsed,
        "latency": {"p50_ms": result["p50_us"] / 1000, "p99_ms": result["p99_us"] / 1000},
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
    }


def submit_round(
    url: str, base: str, key: str, server: Proc, cfg: dict[str, Any], *, use_wrk: bool
) -> dict[str, Any]:
    if use_wrk:
        # Warm wrk's connections and the server's pool, outside the counts.
        wrk_run(base, key, cfg["connections"], 1)
    cpu_server = server.cpu_seconds()
    cpu_pg = sum(process_cpu_seconds(p) for p in backend_pids(url))
    if use_wrk:
        result = wrk_run(base, key, cfg["connections"], cfg["seconds"])
        result["load_generator"] = "wrk"
    else:
        result = python_load(base, key, cfg)
        result["load_generator"] = "httpx"
    result["server_cpu_ms_per_request"] = (
        (server.cpu_seconds() - cpu_server) * 1000 / max(result["ok"], 1)
    )
    result["load_cpu_ms_per_request"] = result["cpu_seconds"] * 1000 / max(result["ok"], 1)
    result["pg_cpu_ms_per_request"] = (
        (sum(process_cpu_seconds(p) for p in backend_pids(url)) - cpu_pg)
        * 1000
        / max(result["ok"], 1)
    )
    return result


def python_load(base: str, key: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The Python load generator (``load``) in a process of its own (its
    warm-up inside the counts)."""
    load = spawn(
        "bench.api",
        [
            "load",
            "--base",
            base,
            "--key",
            key,
            "--connections",
            str(cfg["connections"]),
            "--seconds",
            str(cfg["seconds"]),
        ],
        name="load generator",
    )
    return last_json(load, timeout=cfg["seconds"] + 60)


def sse_round(url: str, base: str, key: str, cfg: dict[str, Any]) -> dict[str, Any]:
    runlane_system.reset(url)
    ids = asyncio.run(_submit_runs(url, cfg["runs"]))
    ids_file = Path(f"/tmp/runlane-bench-sse-{uuid.uuid4().hex[:8]}.json")
    ids_file.write_text(json.dumps(ids))
    subscribers = spawn(
        "bench.api",
        [
            "sse",
            "--base",
            base,
            "--key",
            key,
            "--ids",
            str(ids_file),
            "--per-run",
            str(cfg["subscribers"] // cfg["runs"]),
        ],
        name="subscribers",
    )
    try:
        subscribers.wait_ready(timeout=120)
        worker = runlane_system.spawn_worker(
            url,
            cfg["runs"],
            mode="events",
            extra=[
                "--events",
                str(cfg["events"]),
                "--event-interval",
                str(cfg["event_interval"]),
            ],
        )
        with running([worker]):
            worker.wait_ready()
            result = last_json(subscribers, timeout=cfg["events"] * 2 + 120)
    finally:
        subscribers.stop()
        ids_file.unlink(missing_ok=True)
    return result


def run(
    size: str = "small",
    runs: int = 3,
    *,
    out_dir: Path | None = None,
    load_generator: str = "auto",
) -> dict[str, Any]:
    """``load_generator``: wrk, httpx, or auto (wrk when on the PATH)."""
    cfg = SIZES[size]
    use_wrk = load_generator == "wrk" or (
        load_generator == "auto" and shutil.which("wrk") is not None
    )
    submits: list[dict[str, Any]] = []
    streams: list[dict[str, Any]] = []
    with bench_database("api") as url:
        key = asyncio.run(_create_key(url))
        server, base = start_server(url)
        with running([server]):
            for rnd in range(runs):
                result = submit_round(url, base, key, server, cfg, use_wrk=use_wrk)
                result["round"] = rnd
                submits.append(result)
                print(
                    f"round {rnd}: {result['per_s']:.0f} submits/s, p50"
                    f" {result['latency']['p50_ms']:.1f} ms, p99 {result['latency']['p99_ms']:.1f}"
                    f" ms, {result['errors']} errors",
                    flush=True,
                )
                sse = sse_round(url, base, key, cfg)
                sse["round"] = rnd
                streams.append(sse)
                print(
                    f"round {rnd}: SSE {sse['streams']} streams, {sse['events']} events,"
                    f" delivery p50 {sse['latency']['p50_ms']:.1f} ms"
                    f" p99 {sse['latency']['p99_ms']:.1f} ms",
                    flush=True,
                )
    summary = {
        "submits_per_s": median([r["per_s"] for r in submits]),
        "submit_p50_ms": median([r["latency"]["p50_ms"] for r in submits]),
        "submit_p99_ms": median([r["latency"]["p99_ms"] for r in submits]),
        "server_cpu_ms_per_request": median([r["server_cpu_ms_per_request"] for r in submits]),
        "pg_cpu_ms_per_request": median([r["pg_cpu_ms_per_request"] for r in submits]),
        "load_cpu_ms_per_request": median([r["load_cpu_ms_per_request"] for r in submits]),
        "load_generator": submits[0]["load_generator"],
        "sse_streams": cfg["subscribers"],
        "sse_runs": cfg["runs"],
        "sse_p50_ms": median([r["latency"]["p50_ms"] for r in streams]),
        "sse_p99_ms": median([r["latency"]["p99_ms"] for r in streams]),
        "sse_events_expected": cfg["subscribers"] // cfg["runs"] * cfg["runs"] * cfg["events"],
        "sse_events_received": median([r["events"] for r in streams]),
    }
    summary["table"] = print_table(
        ["measure", "median of rounds"],
        [
            [
                f"submits/s ({cfg['connections']} connections, {summary['load_generator']})",
                summary["submits_per_s"],
            ],
            ["submit p50 ms", summary["submit_p50_ms"]],
            ["submit p99 ms", summary["submit_p99_ms"]],
            ["API process CPU ms/submit", summary["server_cpu_ms_per_request"]],
            ["PostgreSQL CPU ms/submit", summary["pg_cpu_ms_per_request"]],
            ["load generator CPU ms/submit", summary["load_cpu_ms_per_request"]],
            [
                f"SSE delivery p50 ms ({cfg['subscribers']} streams on {cfg['runs']} runs)",
                summary["sse_p50_ms"],
            ],
            ["SSE delivery p99 ms", summary["sse_p99_ms"]],
            [
                "SSE events received / expected",
                f"{summary['sse_events_received']:.0f} / {summary['sse_events_expected']}",
            ],
        ],
    )
    data = {
        "size": size,
        "runs": runs,
        "config": cfg,
        "submits": submits,
        "streams": streams,
        "summary": summary,
    }
    write_results("api", data, out_dir=out_dir)
    return data


# -- child processes ------------------------------------------------------------------


def serve(url: str, port: int) -> None:
    import logging

    import uvicorn

    from runlane.api import create_app
    from runlane.settings import Settings

    logging.basicConfig(level=logging.WARNING)
    app = create_app(Settings(database_url=url), url)
    # Keep-alive longer than uvicorn's 5 s, so that a load-generator
    # connection left idle meanwhile (its warm-up waits for all 32, after
    # the SSE round of the previous round) is not closed by the server just
    # as the client reuses it: the fifth session's first run of this
    # benchmark stopped at round 1 on such an httpx.ReadError.
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=60,
    )


async def load(base: str, key: str, connections: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=base, headers=headers, limits=limits, timeout=30
    ) as client:
        # Warm the connections and the server's pool first.
        await asyncio.gather(
            *(
                client.post(
                    f"/v1/threads/w{uuid.uuid4().hex}/requests", json={"agent": AGENT, "input": {}}
                )
                for _ in range(connections)
            )
        )
        deadline = time.monotonic() + seconds
        started = time.monotonic()

        async def one_connection() -> None:
            nonlocal errors
            while time.monotonic() < deadline:
                t = time.perf_counter()
                response = await client.post(
                    f"/v1/threads/t{uuid.uuid4().hex}/requests",
                    json={"agent": AGENT, "input": {"t": time.time()}},
                )
                if response.status_code == 201:
                    latencies.append(time.perf_counter() - t)
                else:
                    errors += 1

        await asyncio.gather(*(one_connection() for _ in range(connections)))
        elapsed = time.monotonic() - started
    return {
        "ok": len(latencies),
        "errors": errors,
        "seconds": elapsed,
        "per_s": len(latencies) / elapsed,
        "latency": latency_summary(latencies),
        # Its own CPU (warm-up included): whether the generator, not the
        # server, is what limits the rate.
        "cpu_seconds": time.process_time(),
    }


async def subscribe(base: str, key: str, ids: list[str], per_run: int) -> dict[str, Any]:
    latencies: list[float] = []
    connected = 0
    total = len(ids) * per_run
    all_connected = asyncio.Event()
    ends = 0
    limits = httpx.Limits(max_connections=total + 10, max_keepalive_connections=total + 10)
    headers = {"Authorization": f"Bearer {key}"}
    timeout = httpx.Timeout(300, connect=60)
    async with httpx.AsyncClient(
        base_url=base, headers=headers, limits=limits, timeout=timeout
    ) as client:

        async def stream(run_id: str) -> None:
            nonlocal connected, ends
            async with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
                connected += 1
                if connected == total:
                    all_connected.set()
                event = None
                async for line in response.aiter_lines():
                    if line.startswith("event:"):
                        event = line.split(":", 1)[1].strip()
                    elif line.startswith("data:") and event == "tick":
                        data = json.loads(line.split(":", 1)[1])
                        latencies.append(time.time() - float(data["data"]["t"]))
                    elif line.startswith("data:") and event == "end":
                        ends += 1
                        return

        tasks = [asyncio.create_task(stream(run_id)) for run_id in ids for _ in range(per_run)]
        await asyncio.wait_for(all_connected.wait(), 120)
        print("ready", flush=True)
        await asyncio.gather(*tasks)
    return {
        "streams": total,
        "ended": ends,
        "events": len(latencies),
        "latency": latency_summary(latencies),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--load-generator",
        choices=["auto", "wrk", "httpx"],
        default="auto",
        help="auto: wrk when it is on the PATH, else httpx",
    )


def main(args: argparse.Namespace) -> dict[str, Any]:
    return run(args.size, args.runs, out_dir=args.out_dir, load_generator=args.load_generator)


if __name__ == "__main__":
    child = argparse.ArgumentParser()
    child.add_argument("command", choices=["serve", "load", "sse"])
    child.add_argument("--url")
    child.add_argument("--port", type=int)
    child.add_argument("--base")
    child.add_argument("--key")
    child.add_argument("--connections", type=int, default=32)
    child.add_argument("--seconds", type=float, default=10)
    child.add_argument("--ids")
    child.add_argument("--per-run", type=int, default=10)
    parsed = child.parse_args()
    if parsed.command == "serve":
        serve(parsed.url, parsed.port)
    elif parsed.command == "load":
        print(
            json.dumps(
                asyncio.run(load(parsed.base, parsed.key, parsed.connections, parsed.seconds))
            )
        )
    else:
        ids = json.loads(Path(parsed.ids).read_text())
        print(json.dumps(asyncio.run(subscribe(parsed.base, parsed.key, ids, parsed.per_run))))
    sys.exit(0)
