"""Live throughput and decision latency: HTTP submissions -> started, through NATS and PostgreSQL.

Setup: 1024 H100 GPUs (128 nodes x 8), the ai2-like allocation tree, every node holding one
long 1-GPU workload (so 16-GPU gangs never fit) and 5,000 pending 16-GPU gangs (the backlog
every pass walks). Then N 1-GPU allocated workloads are submitted over HTTP by concurrent
clients; each runs 0.2 s on the simulated executor. Printed:

* sustained submissions/s end to end (first request sent -> last of them ``started``);
* decision latency p50/p99: ``workload.submitted`` at_ms (gateway) -> ``workload.started``
  at_ms (placement), and HTTP send -> ``started`` seen by a log subscriber.

The gateway runs in one child process, the other services in another (``--serve``), the load
generator in this one. Prints numbers; asserts nothing.

    PYTHONPATH=shared:. .venv/bin/python benchmarks/bench_live.py [--n 5000] [--backlog 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT)]

import httpx  # noqa: E402
import msgspec  # noqa: E402

CLUSTER_FILE = """
name = "bench"
[policy]
lookback_window = "7d"
max_min_runtime = "8h"
[[pools]]
gpu_type = "H100"
nodes = 128
gpus_per_node = 8
rack_size = 16
[allocations]
"""
TOKENS = {"bench": {"user": "bench", "admin": True}}


def pct(xs, p):
    xs = sorted(xs)
    return xs[max(0, int(round(p / 100 * len(xs))) - 1)] if xs else float("nan")


async def serve(settings_json: str, services: str) -> None:
    from services.common.runner import setup_logging, wait_for_signal
    from services.common.settings import Settings
    from services.devstack.stack import Stack

    settings = Settings(**json.loads(settings_json))
    setup_logging("WARNING")
    stack = await Stack(settings, services=tuple(services.split(","))).start()
    print("READY", flush=True)
    await wait_for_signal()
    await stack.stop()


async def load(args, settings, url: str) -> None:
    import nats

    from services.common import subjects
    from timeshare import events as ev

    nc = await nats.connect(settings["nats_url"])
    started: dict[str, tuple[int, float]] = {}
    submitted_ms: dict[str, int] = {}
    done = asyncio.Event()
    watch: set[str] = set()

    async def on_msg(msg):
        e = ev.decoder.decode(msg.data)
        if isinstance(e, ev.WorkloadStarted) and e.workload_id not in started:
            started[e.workload_id] = (e.at_ms, time.perf_counter())
            if watch and watch <= started.keys():
                done.set()
        elif isinstance(e, ev.WorkloadSubmitted):
            submitted_ms[e.workload.id] = e.at_ms

    await nc.subscribe(subjects.log_filter("bench"), cb=on_msg)
    headers = {"Authorization": "Bearer bench"}
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=limits) as http:
        leaves = sorted(k for k in ALLOC if not any(o.startswith(k + "/") for o in ALLOC))

        async def post_all(bodies):
            sent = {}
            queue = list(bodies)

            async def worker():
                while queue:
                    b = queue.pop()
                    sent[b["id"]] = time.perf_counter()
                    r = await http.post("/v1/workloads", json=b)
                    if r.status_code != 202:
                        raise RuntimeError(r.text)

            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
            return sent

        t0 = time.perf_counter()
        pins = [{"id": f"pin-{i}", "project": leaves[i % len(leaves)], "gpu_type": "H100", "gpus": 1,
                 "work_s": 10**6, "min_runtime_s": 3600} for i in range(128)]
        watch.update(b["id"] for b in pins)
        await post_all(pins)
        await asyncio.wait_for(done.wait(), 120)
        backlog = [{"id": f"gang-{i}", "project": leaves[i % len(leaves)], "gpu_type": "H100", "gpus": 16,
                    "work_s": 3600, "min_runtime_s": 0} for i in range(args.backlog)]
        await post_all(backlog)
        print(f"setup: 128 pinned nodes, {args.backlog} pending 16-GPU gangs in {time.perf_counter() - t0:.1f}s",
              flush=True)
        await asyncio.sleep(2)
        done.clear()
        watch.clear()
        bodies = [{"id": f"job-{i}", "project": leaves[i % len(leaves)], "gpu_type": "H100", "gpus": 1,
                   "work_s": 1, "min_runtime_s": 1, "resumable": True} for i in range(args.n)]
        watch.update(b["id"] for b in bodies)
        t1 = time.perf_counter()
        sent = await post_all(bodies)
        t_sent = time.perf_counter()
        await asyncio.wait_for(done.wait(), 300)
        t_end = time.perf_counter()
    ids = [b["id"] for b in bodies]
    decision_ms = [started[i][0] - submitted_ms[i] for i in ids if i in submitted_ms]
    e2e_ms = [(started[i][1] - sent[i]) * 1000 for i in ids]
    print(f"\nlive bench: 1024 GPUs, {args.backlog} pending gangs, {args.n} submissions, "
          f"{args.concurrency} concurrent HTTP clients, store {settings['database_url'].split('@')[0]}")
    print(f"  HTTP accepted:            {args.n / (t_sent - t1):8.0f} submissions/s")
    print(f"  sustained HTTP->started:  {args.n / (t_end - t1):8.0f} submissions/s  ({t_end - t1:.2f}s)")
    print(f"  decision latency submitted->started (event times): p50 {pct(decision_ms, 50):.0f} ms, "
          f"p99 {pct(decision_ms, 99):.0f} ms")
    print(f"  end to end HTTP send->started seen:             p50 {pct(e2e_ms, 50):.0f} ms, "
          f"p99 {pct(e2e_ms, 99):.0f} ms")
    await nc.close()


ALLOC: dict[str, float] = {}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--backlog", type=int, default=5000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--memory", action="store_true", help="in-memory stores instead of PostgreSQL")
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--services", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.services))
        return 0
    import tomllib

    from services.devstack.servers import NatsServer, PostgresServer, free_port, postgres_bin_dir

    ALLOC.update(tomllib.loads((ROOT / "examples/ai2-like/scenario.toml").read_text())["allocations"])
    tmp = Path(tempfile.mkdtemp(prefix="timeshare-bench-"))
    cluster_file = tmp / "bench.toml"
    cluster_file.write_text(CLUSTER_FILE + "".join(f'"{k}" = {v}\n' for k, v in ALLOC.items()))
    nats_server = NatsServer(str(tmp / "nats")).start()
    pg = PostgresServer().start() if (postgres_bin_dir() and not args.memory) else None
    port = free_port()
    settings = {"nats_url": nats_server.url, "database_url": pg.dsn if pg else "memory",
                "cluster_file": str(cluster_file), "cluster": "bench", "http_port": port,
                "tokens": json.dumps(TOKENS), "time_scale": 0.2, "heartbeat_timeout_s": 0.0}
    # the gateway in one process, the other services in another (as deployed: one per service)
    children = []
    for group in ("placement,budget,ledger,health,executor", "gateway"):
        children.append(subprocess.Popen(
            [sys.executable, __file__, "--serve", json.dumps(settings), "--services", group],
            stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=f"{ROOT / 'shared'}:{ROOT}")))
        line = children[-1].stdout.readline().decode()
        if "READY" not in line:
            raise RuntimeError(f"services did not start: {line}")
    try:
        asyncio.run(load(args, settings, f"http://127.0.0.1:{port}"))
    finally:
        for child in children:
            child.terminate()
            child.wait(20)
        if pg:
            pg.stop()
        nats_server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
