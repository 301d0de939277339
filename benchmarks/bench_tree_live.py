"""A large allocation tree through the live stack (issue 21's live targets).

A cluster whose allocation tree has 10,000 leaves in 5 levels (fan-out 2 x 5 x 10 x 10 x 10),
served by the real services on a throwaway NATS JetStream and PostgreSQL, placement in its own
process. Then:

1. one ``PUT /v1/allocations`` adds 1,000 leaves under one parent: the HTTP status and time;
2. all along, placement's health is asked over NATS every 100 ms (1 s timeout): how many asks
   went unanswered and the longest gap between two answers;
3. placement is killed (SIGKILL) and started again: the time until it answers healthy as the
   leader, with that tree (the new leaves) in its state.

Prints, never asserts (``make bench-tree-live``). Timings are wall clock on a shared machine:
the 10M-iteration loop's CPU time is printed beside them.

    PYTHONPATH=shared:. .venv/bin/python benchmarks/bench_tree_live.py [--fanout 2,5,10,10,10] [--add 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT)]

import bench_live  # noqa: E402  (benchmarks/, next to this script: its services and token)
from bench_scale import loop_cpu_s  # noqa: E402

#: bench_live's 128-node H100 cluster under another name; the tree is appended
CLUSTER_FILE = bench_live.CLUSTER_FILE.replace('name = "bench"', 'name = "tree"')
TOKENS = bench_live.TOKENS


def tree(fanout: list[int]) -> dict[str, float]:
    """Every node of a tree with the given fan-out per level, share 1 each."""
    out: dict[str, float] = {}
    for depth in range(1, len(fanout) + 1):
        for idx in itertools.product(*(range(f) for f in fanout[:depth])):
            out["/".join(f"l{d}n{i}" for d, i in enumerate(idx))] = 1.0
    return out


def start(group: str, settings: dict) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, str(ROOT / "benchmarks/bench_live.py"), "--serve",
                              json.dumps(settings), "--services", group], stdout=subprocess.PIPE,
                             env=dict(os.environ, PYTHONPATH=f"{ROOT / 'shared'}:{ROOT}", BENCH_PROFILE=""))
    seen = []
    while "READY" not in (line := child.stdout.readline().decode()):  # the gateway prints its URL first
        seen.append(line)
        if not line:
            raise RuntimeError(f"{group} did not start: {''.join(seen)!r}")
    return child


async def measure(args, settings: dict, url: str, restart) -> None:
    import httpx
    import msgspec
    import nats

    from services.common import healthz

    creds = json.loads(open(settings["nats_credentials"]).read())
    nc = await nats.connect(settings["nats_url"], user="operator", password=creds["operator"])
    subject = healthz.subject("tree", "placement")
    answers: list[float] = []
    unanswered = 0
    stop = asyncio.Event()

    async def ask() -> dict | None:
        try:
            return msgspec.json.decode((await nc.request(subject, b"{}", timeout=1.0)).data)
        except Exception:
            return None

    async def poll() -> None:
        nonlocal unanswered
        while not stop.is_set():
            if await ask() is not None:
                answers.append(time.perf_counter())
            else:
                unanswered += 1
            await asyncio.sleep(0.1)

    poller = asyncio.create_task(poll())
    await asyncio.sleep(1)
    parent = next(iter(k for k in ALLOC if k.count("/") == len(args.fanout) - 2))
    new = {f"{parent}/added{i:04d}": 1.0 for i in range(args.add)}
    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        r = await http.put("/v1/allocations", json={"shares": new, "reason": "bench: 1,000 new projects"},
                           headers={"Authorization": "Bearer bench"})
        put_s = time.perf_counter() - t0
        print(f"PUT /v1/allocations adding {args.add} leaves: HTTP {r.status_code} in {put_s:.2f} s "
              f"{r.text[:200] if r.status_code != 200 else ''}", flush=True)
        # until placement's tree holds them (the change is a budget.changed event in the log)
        applied_s = None
        while time.perf_counter() - t0 < 120:
            t = await http.get("/v1/allocations", headers={"Authorization": "Bearer bench"})
            if t.status_code == 200 and f"{parent}/added{args.add - 1:04d}" in t.text:
                applied_s = time.perf_counter() - t0
                break
            await asyncio.sleep(0.5)
    await asyncio.sleep(2)
    stop.set()
    await poller
    gaps = [b - a for a, b in zip(answers, answers[1:])]
    print(f"GET /v1/allocations shows them after {applied_s:.2f} s" if applied_s is not None else
          f"GET /v1/allocations did not show them within 120 s (last answer: HTTP {t.status_code} {t.text[:200]})")
    print(f"placement health during the change: {len(answers)} answered, {unanswered} unanswered, "
          f"longest gap between answers {max(gaps, default=0):.2f} s")

    t1 = time.perf_counter()
    restart()
    while True:
        report = await ask()
        if report is not None and report.get("ok") and report.get("leader", True):
            break
        await asyncio.sleep(0.1)
    print(f"placement killed and started again: healthy leader after {time.perf_counter() - t1:.2f} s "
          "(process start included)")
    await nc.close()


ALLOC: dict[str, float] = {}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--fanout", default="2,5,10,10,10", help="children per level (default: 10,000 leaves in 5 levels)")
    p.add_argument("--add", type=int, default=1000, help="leaves added by one PUT (at most 1,000 per request)")
    args = p.parse_args()
    args.fanout = [int(x) for x in args.fanout.split(",")]
    from services.common.runner import run_async
    from services.devstack.servers import NatsServer, PostgresServer, free_port, postgres_bin_dir

    ALLOC.update(tree(args.fanout))
    leaves = sum(1 for k in ALLOC if k.count("/") == len(args.fanout) - 1)
    print(f"tree: {len(ALLOC)} nodes, {leaves} leaves in {len(args.fanout)} levels; "
          f"10M-iteration loop {loop_cpu_s():.2f} s of CPU", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="timeshare-tree-"))
    (tmp / "tree.toml").write_text(CLUSTER_FILE + "".join(f'"{k}" = {v}\n' for k, v in ALLOC.items()))
    nats_server = NatsServer(str(tmp / "nats")).start()
    pg = PostgresServer().start() if postgres_bin_dir() else None
    port = free_port()
    settings = {"nats_url": nats_server.url, "nats_credentials": nats_server.credentials_file,
                "database_url": pg.dsn if pg else "memory", "cluster_file": str(tmp / "tree.toml"),
                "cluster": "tree", "http_port": port, "tokens": json.dumps(TOKENS), "time_scale": 0.2,
                "heartbeat_timeout_s": 0.0}
    children: dict[str, subprocess.Popen] = {}
    t = time.perf_counter()
    for group in ("placement", "budget,ledger,health,executor", "gateway"):
        children[group] = start(group, settings)
    print(f"stack up in {time.perf_counter() - t:.1f} s", flush=True)

    def restart() -> None:
        children["placement"].send_signal(signal.SIGKILL)
        children["placement"].wait()
        children["placement"] = start("placement", settings)

    try:
        run_async(measure(args, settings, f"http://127.0.0.1:{port}", restart))
    finally:
        for child in children.values():
            child.terminate()
            child.wait(20)
        if pg:
            pg.stop()
        nats_server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
