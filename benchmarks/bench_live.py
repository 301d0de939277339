"""Live throughput and decision latency: HTTP submissions -> started, through NATS and PostgreSQL.

Setup: 1024 H100 GPUs (128 nodes x 8), the ai2-like allocation tree, every node holding one
long 1-GPU workload (so 16-GPU gangs never fit) and 5,000 pending 16-GPU gangs (the backlog
every pass walks). Then N 1-GPU allocated workloads are submitted over HTTP by concurrent
clients; each runs 0.2 s on the simulated executor. Printed:

* sustained submissions/s end to end (first request sent -> last of them ``started``);
* decision latency p50/p99: ``workload.submitted`` at_ms (gateway) -> ``workload.started``
  at_ms (placement), and HTTP send -> ``started`` seen by a log subscriber.

Placement runs in one child process, the gateway in another, budget + ledger + health +
executor in a third (``--serve``), the load generator in this one. Prints numbers (and the CPU
each process spent per submission); asserts nothing.

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


PIDS: dict[str, list[int]] = {}  # component -> processes, for CPU accounting


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return total


def postgres_pids(data_dir: str) -> list[int]:
    try:
        master = int(Path(data_dir, "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    out = [master]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == master:
                out.append(int(stat.parent.name))
        except (OSError, ValueError):
            pass
    return out


def cpu_snapshot() -> dict[str, float]:
    return {name: cpu_seconds(pids) for name, pids in PIDS.items()}


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
    profile = os.environ.get("BENCH_PROFILE")
    if profile:  # --profile DIR: a cProfile of each service process while the load runs
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    print("READY", flush=True)
    await wait_for_signal()
    if profile:
        prof.disable()
        prof.dump_stats(os.path.join(profile, services.replace(",", "+") + ".prof"))
    await stack.stop()


async def load(args, settings, url: str) -> None:
    import nats

    from services.common import subjects
    from timeshare import events as ev

    import json as _json

    creds = _json.loads(open(settings["nats_credentials"]).read())  # the operator reads the log
    nc = await nats.connect(settings["nats_url"], user="operator", password=creds["operator"])
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
    host, port = url.split("//", 1)[1].split(":")
    leaves = sorted(k for k in ALLOC if not any(o.startswith(k + "/") for o in ALLOC))

    async def post_all(bodies, rate: float = 0.0):
        """POST every body over ``concurrency`` keep-alive connections; {workload id: send time}.

        A minimal HTTP/1.1 client (one request in flight per connection): httpx costs about
        4 ms of CPU per request, as much as the system under test, on the same 2 CPUs."""
        sent = {}
        queue = list(reversed(bodies))
        t_start = time.perf_counter()
        n_total = len(bodies)

        async def worker():
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                while queue:
                    due = t_start + (n_total - len(queue)) / rate if rate > 0 else 0.0
                    payload = msgspec.json.encode(queue.pop())
                    if rate > 0 and due > time.perf_counter():  # open loop: request k leaves at k / rate
                        await asyncio.sleep(due - time.perf_counter())
                    t = time.perf_counter()
                    writer.write(b"POST /v1/workloads HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer bench\r\n"
                                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(payload), payload))
                    status = int((await reader.readline()).split()[1])
                    length = 0
                    while (line := await reader.readline()) not in (b"\r\n", b""):
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    body = await reader.readexactly(length)
                    if status != 202:
                        raise RuntimeError(f"{status}: {body.decode(errors='replace')}")
                    sent[msgspec.json.decode(body)["workload_id"]] = t
            finally:
                writer.close()

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
    # the measured submissions: like the CLI, no client id (the gateway makes one) unless --ids
    bodies = [{"project": leaves[i % len(leaves)], "gpu_type": "H100", "gpus": 1,
               "work_s": 1, "min_runtime_s": 1, "resumable": True} for i in range(args.n)]
    if args.ids:
        for i, b in enumerate(bodies):
            b["id"] = f"job-{i}"
    load0, cpu0 = os.getloadavg()[0], cpu_snapshot()
    t1 = time.perf_counter()
    sent = await post_all(bodies, args.rate)
    t_sent = time.perf_counter()
    ids = list(sent)
    watch.update(ids)
    if not watch <= started.keys():
        await asyncio.wait_for(done.wait(), 300)
    t_end = time.perf_counter()
    cpu1, load1 = cpu_snapshot(), os.getloadavg()[0]
    decision_ms = [started[i][0] - submitted_ms[i] for i in ids if i in submitted_ms]
    e2e_ms = [(started[i][1] - sent[i]) * 1000 for i in ids]
    print(f"\nlive bench: 1024 GPUs, {args.backlog} pending gangs, {args.n} submissions "
          f"({'client' if args.ids else 'gateway'} ids), offered {f'{args.rate:g}/s' if args.rate else 'as fast as accepted'}"
          f" over {args.concurrency} HTTP connections, "
          f"store {settings['database_url'].split('@')[0]}, {os.cpu_count()} CPUs, "
          f"load average {load0:.1f} -> {load1:.1f} (1 min)")
    print(f"  HTTP accepted:            {args.n / (t_sent - t1):8.0f} submissions/s")
    print(f"  sustained HTTP->started:  {args.n / (t_end - t1):8.0f} submissions/s  ({t_end - t1:.2f}s)")
    used = {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}
    print("  CPU per submission:       " + ", ".join(f"{k} {v / args.n * 1000:.2f} ms" for k, v in used.items())
          + f"; total {sum(used.values()) / args.n * 1000:.2f} ms"
          + f" (ceiling on {os.cpu_count()} CPUs: {os.cpu_count() * args.n / max(sum(used.values()), 1e-9):.0f}/s)")
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
    p.add_argument("--rate", type=float, default=1000.0,
                   help="offered submissions/s, open loop (default 1000: the target); 0 = as fast as it answers")
    p.add_argument("--memory", action="store_true", help="in-memory stores instead of PostgreSQL")
    p.add_argument("--ids", action="store_true", help="measured submissions carry client ids (an existence "
                   "check per request) instead of gateway-made ones")
    p.add_argument("--profile", metavar="DIR", help="write a cProfile of each service process into DIR")
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--services", help=argparse.SUPPRESS)
    args = p.parse_args()
    from services.common.runner import run_async

    if args.serve:
        run_async(serve(args.serve, args.services))
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
    settings = {"nats_url": nats_server.url, "nats_credentials": nats_server.credentials_file, "database_url": pg.dsn if pg else "memory",
                "cluster_file": str(cluster_file), "cluster": "bench", "http_port": port,
                "tokens": json.dumps(TOKENS), "time_scale": 0.2, "heartbeat_timeout_s": 0.0}
    # placement, the gateway and the other services in separate processes (as deployed)
    children = []
    for group in ("placement", "budget,ledger,health,executor", "gateway"):
        children.append(subprocess.Popen(
            [sys.executable, __file__, "--serve", json.dumps(settings), "--services", group],
            stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=f"{ROOT / 'shared'}:{ROOT}",
                                             BENCH_PROFILE=os.path.abspath(args.profile) if args.profile else "")))
        PIDS[group if "," not in group else "others"] = [children[-1].pid]
        line = children[-1].stdout.readline().decode()
        if "READY" not in line:
            raise RuntimeError(f"services did not start: {line}")
    PIDS["load"] = [os.getpid()]
    PIDS["nats"] = [nats_server.proc.pid]
    if pg:
        PIDS["postgres"] = postgres_pids(pg.data_dir)
    try:
        run_async(load(args, settings, f"http://127.0.0.1:{port}"))
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
