"""Faults under a steady flow of submissions (``make chaos``; a reduced run is an integration test).

It starts its own nats-server and PostgreSQL, every service as a separate process
(``python -m services.<name>``, two placement replicas), and a client that submits workloads
over HTTP at a steady rate, each with an ``Idempotency-Key`` and retried until accepted (as an
operator's script would). Then, one after another with steady flow in between, it injects the
faults asked for:

* ``nats``      nats-server stopped (SIGTERM), down ``--down`` seconds, started on the same store
* ``postgres``  PostgreSQL stopped (``pg_ctl -m immediate``: a crash), down, started again
* ``<service>`` that service's process killed with SIGKILL and started again a second later
  (``placement`` kills the leader; its standby takes over)

For each fault it prints how long after the server's (or service's) return scheduling resumed
(the first ``workload.started`` stamped after it) and the durable projections caught up with
the log as it was at that moment. At the end it stops the flow, waits for every accepted
workload to complete, and checks the log and the stores: every accepted submission in the log
exactly once and completed exactly once (0 lost, 0 duplicated), no GPU double-booked, no
protected work preempted (the invariant checker of tests/invariants.py), the gateway's and
the ledger's PostgreSQL stores holding each workload once, and ``/healthz`` answering ok.
Speeds are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from timeshare import events as ev

from ..common import subjects
from ..common.bus import Bus
from ..common.cluster_config import load_cluster
from ..common.settings import DEFAULT_CLUSTER_FILE, Settings
from .servers import NatsCluster, NatsServer, PostgresServer, free_port, spawn_service

SERVICES = ("placement", "budget", "ledger", "health", "executor", "gateway")
FAULTS = ("nats", "postgres", *SERVICES)
TOKEN = "chaos-admin"


@dataclass
class FaultResult:
    fault: str
    down_s: float
    #: from the return of the server / service to the first workload started after it
    scheduling_resumed_s: float | None = None
    #: from the return to every durable projection having applied the log as it was then
    projections_caught_up_s: float | None = None


@dataclass
class ChaosResult:
    faults: list[FaultResult] = field(default_factory=list)
    accepted: int = 0
    http_retries: Counter = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    not_completed: list[str] = field(default_factory=list)
    gateway_rows: Counter = field(default_factory=Counter)
    ledger_duplicates: int = 0
    healthz_status: int = 0
    healthz: dict = field(default_factory=dict)
    events: list = field(default_factory=list)
    invariant_error: str | None = None

    @property
    def ok(self) -> bool:
        recovered = all(f.scheduling_resumed_s is not None and f.projections_caught_up_s is not None
                        for f in self.faults)
        return recovered and not (self.lost or self.duplicated or self.not_completed or self.ledger_duplicates
                                  or self.invariant_error or self.gateway_behind) and self.healthz_status == 200

    @property
    def gateway_behind(self) -> int:
        """Accepted workloads the gateway's store does not show completed."""
        return self.accepted - self.gateway_rows.get("completed", 0)


class Flow:
    """Steady submissions over HTTP, each retried with its Idempotency-Key until accepted."""

    def __init__(self, url: str, projects: list[str], rate: float, max_gpus: int = 2):
        self.url = url
        self.projects = projects
        self.rate = rate
        self.max_gpus = max_gpus
        self.accepted: dict[str, str] = {}  # idempotency key -> workload id
        self.retries: Counter = Counter()
        self.stop = asyncio.Event()
        self.pending: set[asyncio.Task] = set()

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"},
                                     timeout=15, limits=limits) as http:
            i = 0
            t0 = time.monotonic()
            while not self.stop.is_set():
                task = asyncio.create_task(self._submit(http, i))
                self.pending.add(task)
                task.add_done_callback(self.pending.discard)
                i += 1
                await asyncio.sleep(max(0.0, t0 + i / self.rate - time.monotonic()))
            if self.pending:
                await asyncio.gather(*self.pending)

    async def _submit(self, http: httpx.AsyncClient, i: int) -> None:
        key = f"chaos-{i}"
        body = {"project": self.projects[i % len(self.projects)], "gpu_type": "H100",
                "gpus": 1 + i % self.max_gpus, "work_s": 1 + i % 3, "min_runtime_s": i % 2, "resumable": True}
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                r = await http.post("/v1/workloads", json=body, headers={"Idempotency-Key": key})
                if r.status_code == 202 and r.json().get("state") != "unconfirmed":
                    self.accepted[key] = r.json()["workload_id"]
                    return
                # a 5xx means not done; "unconfirmed" (202) may be done: both are sent again with
                # the same key, which runs the work at most once (issue 22)
                self.retries["202 unconfirmed" if r.status_code == 202 else str(r.status_code)] += 1
                if r.status_code < 500:
                    raise RuntimeError(f"submission {key} refused: {r.status_code} {r.text}")
            except httpx.HTTPError as exc:
                self.retries[type(exc).__name__] += 1
            await asyncio.sleep(0.25)
        raise RuntimeError(f"submission {key} not accepted within 180 s")


class Chaos:
    def __init__(self, workdir: str, cluster_file: str = DEFAULT_CLUSTER_FILE, rate: float = 10.0,
                 down_s: float = 3.0, gap_s: float = 5.0, lease_ttl_s: float = 3.0, echo=print,
                 nats_cluster: int = 0):
        self.workdir = workdir
        self.cluster_file = cluster_file
        self.rate = rate
        self.down_s = down_s
        self.gap_s = gap_s
        self.lease_ttl_s = lease_ttl_s
        self.echo = echo
        #: 0: one nats-server; 3: a JetStream cluster of three (streams with 3 replicas), where
        #: the ``nats`` fault SIGKILLs the server leading the log stream
        self.nats_cluster = nats_cluster
        self.procs: dict[str, object] = {}
        self.standby = None
        self.log_of: dict[int, str] = {}  # pid -> its log file

    # -- servers and services ------------------------------------------------------------------
    def start_servers(self) -> None:
        if self.nats_cluster:
            self.nats = NatsCluster(os.path.join(self.workdir, "nats"), self.nats_cluster).start()
        else:
            self.nats = NatsServer(os.path.join(self.workdir, "nats")).start()
        self.pg = PostgresServer().start()
        config = load_cluster(self.cluster_file, "")
        self.config = config
        self.settings = Settings(
            nats_url=self.nats.url, nats_credentials=self.nats.credentials_file, database_url=self.pg.dsn,
            cluster_file=self.cluster_file, cluster=config.name,
            http_port=free_port(), tokens=json.dumps({TOKEN: {"user": "chaos", "admin": True}}),
            lease_ttl_s=self.lease_ttl_s, pass_interval_s=5.0, heartbeat_timeout_s=0, time_scale=1.0,
            log_level="INFO", stuck_after_s=30.0, replicas=3 if self.nats_cluster else 1,
            snapshot_every=1000,  # a killed leader's successor starts from a snapshot
            purge_log="off")  # the final check reads the whole log: 0 lost, 0 duplicated

    def spawn(self, name: str, tag: str = ""):
        path = os.path.join(self.workdir, f"{name}{tag}.log")
        proc = spawn_service(name, self.settings, path)
        self.log_of[proc.pid] = path
        return proc

    async def start_services(self) -> None:
        if self.nats_cluster:  # JetStream answers once the cluster elected its meta leader
            async def js_ready():
                try:
                    bus = await Bus.connect(self.settings, self.config.name, name="chaos-probe")
                except Exception:
                    return False
                try:
                    await bus.ensure_infra()
                    return True
                except Exception:
                    return False
                finally:
                    await bus.close()

            await self._until(js_ready, 60, "the NATS cluster's JetStream")
        from ..admin.setup import setup

        await setup(self.settings, [self.config.name])  # the operator's step: services only bind
        for name in SERVICES:
            self.procs[name] = self.spawn(name)
        self.standby = self.spawn("placement", "-standby")
        async with httpx.AsyncClient(timeout=2) as http:
            await self._until(lambda: self._healthy(http), 60, "every service to answer /healthz")

    def stop_all(self) -> None:
        for p in [*self.procs.values(), self.standby]:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in [*self.procs.values(), self.standby]:
            if p is None:
                continue
            try:
                p.wait(10)
            except Exception:
                p.kill()
        self.nats.stop()
        self.pg.stop()

    def log_tails(self, lines: int = 30) -> str:
        """The last lines of every process's log: what a failed run prints (CI keeps no files)."""
        out = []
        for pid, path in self.log_of.items():
            try:
                with open(path, errors="replace") as f:
                    tail = f.readlines()[-lines:]
            except OSError:
                continue
            out.append(f"--- {os.path.basename(path)} (pid {pid}), last {len(tail)} lines ---")
            out.extend(line.rstrip("\n") for line in tail)
        return "\n".join(out)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.http_port}"

    async def _healthy(self, http) -> bool:
        try:
            r = await http.get(self.url + "/healthz")
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    async def _until(self, predicate, timeout_s: float, what: str):
        deadline = time.monotonic() + timeout_s
        last_error = None
        while time.monotonic() < deadline:
            try:  # the driver's own requests meet the faults too (a stream electing a leader)
                result = await predicate()
            except Exception as exc:  # noqa: BLE001
                result, last_error = None, exc
            if result:
                return result
            await asyncio.sleep(0.1)
        raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}"
                           + (f" (last error: {last_error!r})" if last_error else ""))

    # -- faults ---------------------------------------------------------------------------------
    async def inject(self, fault: str, bus: Bus) -> FaultResult:
        result = FaultResult(fault, self.down_s if fault in ("nats", "postgres") else 1.0)
        if fault == "nats" and self.nats_cluster:
            info = await bus.js.stream_info(subjects.LOG_STREAM)
            leader = self.nats.by_name(info.cluster.leader)
            result.fault = f"nats {leader.name} (log leader, SIGKILL)"
            leader.stop(signal.SIGKILL)
            await asyncio.sleep(self.down_s)
            leader.start()
        elif fault == "nats":
            self.nats.stop()
            await asyncio.sleep(self.down_s)
            self.nats.start()
        elif fault == "postgres":
            self.pg.stop(mode="immediate")
            await asyncio.sleep(self.down_s)
            self.pg.start()
        else:
            victim = await self._leader_proc(bus) if fault == "placement" else self.procs[fault]
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            await asyncio.sleep(1.0)
            replacement = self.spawn(fault, f"-{int(time.time())}")
            if fault == "placement":  # the old standby leads now; the new process stands by
                if victim is self.standby:
                    self.standby = replacement
                else:
                    self.procs["placement"], self.standby = self.standby, replacement
            else:
                self.procs[fault] = replacement
        back = time.monotonic()
        back_ms = int(time.time() * 1000)
        seq_at_return = await self._log_last_seq(bus)

        async def resumed():
            return any(isinstance(e, ev.WorkloadStarted) and e.at_ms >= back_ms
                       for e in await self._tail(bus, max(1, seq_at_return - 200)))

        async def caught_up():
            return await self._projections_at(bus, seq_at_return)

        pending = {"resumed": resumed, "caught_up": caught_up}
        deadline = back + 120
        while pending and time.monotonic() < deadline:
            for name, check in list(pending.items()):
                try:
                    done = await check()
                except Exception:
                    done = False
                if done:
                    took = round(time.monotonic() - back, 2)
                    if name == "resumed":
                        result.scheduling_resumed_s = took
                    else:
                        result.projections_caught_up_s = took
                    del pending[name]
            await asyncio.sleep(0.1)
        return result

    async def _leader_proc(self, bus: Bus):
        """The placement process that holds the lease (its log says "placement <instance> leads").

        The lease is asked, not the leader's digest query: a query goes unanswered while no
        instance leads (a term changing hands on a slow machine), and one unanswered request
        once failed the whole run before any fault was injected."""
        async def holder():
            kv = await bus.js.key_value(subjects.LEASE_BUCKET)
            entry = await kv.get(f"placement.{self.config.name}")
            return entry.value.decode() if entry.value else None

        leader = await self._until(holder, 60, "a placement instance to hold the lease")
        for proc in (self.procs["placement"], self.standby):
            path = self.log_of.get(proc.pid, "")
            if proc.poll() is None and os.path.exists(path) and f"placement {leader} leads" in open(path).read():
                return proc
        return self.procs["placement"]

    async def _log_last_seq(self, bus: Bus) -> int:
        async def ask():  # the stream may be electing a leader right after a fault
            try:
                return (await bus.js.stream_info(subjects.LOG_STREAM)).state.last_seq or -1
            except Exception:
                return None

        seq = await self._until(ask, 60, "the log stream to answer")
        return max(seq, 0)

    async def _tail(self, bus: Bus, start_seq: int) -> list[ev.Event]:
        out: list[ev.Event] = []
        await bus.replay(subjects.LOG_STREAM, subjects.log_filter(self.config.name),
                         lambda m: out.append(ev.decoder.decode(m.data)), start_seq=start_seq)
        return out

    async def _projections_at(self, bus: Bus, seq: int) -> bool:
        for svc in ("gateway", "ledger", "budget", "health"):
            info = await bus.js.consumer_info(subjects.LOG_STREAM, f"{svc}-{self.config.name}")
            floor = info.ack_floor.stream_seq if info.ack_floor else 0
            if floor < seq and (info.num_pending or info.num_ack_pending):
                return False
        return True

    # -- the run --------------------------------------------------------------------------------
    async def run(self, faults: list[str]) -> ChaosResult:
        result = ChaosResult()
        await self.start_services()
        bus = await Bus.connect(self.settings, self.config.name, name="chaos")
        projects = sorted(self.config.tree().leaves)
        flow = Flow(self.url, projects, self.rate)
        flow_task = asyncio.create_task(flow.run())
        try:
            await asyncio.sleep(self.gap_s)
            for fault in faults:
                self.echo(f"  fault: {fault:<10} ", end="")
                r = await self.inject(fault, bus)
                result.faults.append(r)
                self.echo(f"scheduling resumed {_s(r.scheduling_resumed_s)} and projections caught up "
                          f"{_s(r.projections_caught_up_s)} after its return")
                await asyncio.sleep(self.gap_s)
            flow.stop.set()
            await flow_task
            result.accepted = len(flow.accepted)
            result.http_retries = flow.retries
            await self.check(bus, flow, result)
        finally:
            if not flow_task.done():
                flow.stop.set()
                flow_task.cancel()
            await bus.close()
        return result

    async def check(self, bus: Bus, flow: Flow, result: ChaosResult) -> None:
        ids = set(flow.accepted.values())

        async def all_completed():
            events = await self._tail(bus, 1)
            done = Counter(e.workload_id for e in events if isinstance(e, ev.WorkloadCompleted))
            return events if ids <= set(done) else None

        try:
            events = await self._until(all_completed, 180, "every accepted workload to complete")
        except TimeoutError:
            events = await self._tail(bus, 1)
        result.events = events
        submitted = Counter(e.workload.id for e in events if isinstance(e, ev.WorkloadSubmitted))
        completed = Counter(e.workload_id for e in events if isinstance(e, ev.WorkloadCompleted))
        result.lost = sorted(ids - set(submitted))
        result.duplicated = sorted(w for w, n in submitted.items() if n > 1)
        result.duplicated += sorted(f"{w} (completed {n}x)" for w, n in completed.items() if n > 1)
        result.not_completed = sorted(ids - set(completed))
        try:
            from tests.invariants import check_no_gpu_double_booked, check_protection

            check_no_gpu_double_booked(events)
            check_protection(events)
        except AssertionError as exc:
            result.invariant_error = str(exc)
        except ImportError:
            result.invariant_error = None  # installed without the tests: the counts above still hold
        # the stores: each workload once in the gateway's read model and the ledger's journal
        import asyncpg

        async def stores_caught_up():
            last = await self._log_last_seq(bus)
            return await self._projections_at(bus, last)

        await self._until(stores_caught_up, 60, "the projections to reach the end of the log")
        conn = await asyncpg.connect(self.pg.dsn)
        try:
            rows = await conn.fetch("SELECT doc->>'state' AS state, count(*) AS n FROM gateway.records "
                                    "WHERE kind = 'workload' GROUP BY 1")
            result.gateway_rows = Counter({r["state"]: r["n"] for r in rows})
            result.ledger_duplicates = await conn.fetchval(
                "SELECT count(*) - count(DISTINCT doc->'workload'->>'id') FROM ledger.journal "
                "WHERE kind = 'events' AND doc->>'type' = 'workload.submitted'")
        finally:
            await conn.close()
        async with httpx.AsyncClient(timeout=5, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            async def healthy():
                r = await http.get(self.url + "/healthz")
                result.healthz_status, result.healthz = r.status_code, r.json()
                return r.status_code == 200

            try:
                await self._until(healthy, 30, "/healthz to answer ok")
            except TimeoutError:
                pass


def _s(v: float | None) -> str:
    return f"{v:.2f}s" if v is not None else "NEVER (120 s)"


def report(result: ChaosResult, echo=print) -> None:
    echo("")
    echo(f"faults injected: {len(result.faults)} ({', '.join(f.fault for f in result.faults)})")
    echo("| fault | down | scheduling resumed after return | projections caught up after return |")
    echo("|---|---|---|---|")
    for f in result.faults:
        echo(f"| {f.fault} | {f.down_s:.0f} s | {_s(f.scheduling_resumed_s)} | {_s(f.projections_caught_up_s)} |")
    echo(f"accepted submissions: {result.accepted}; HTTP answers retried by the client: "
         f"{dict(result.http_retries) or 'none'}")
    echo(f"lost: {len(result.lost)}  duplicated: {len(result.duplicated)}  not completed: {len(result.not_completed)}"
         f"  invariants: {result.invariant_error or 'ok (no GPU double-booked, no protected work preempted)'}")
    echo(f"gateway store: {dict(result.gateway_rows)} (not shown completed: {result.gateway_behind}); "
         f"ledger journal duplicates: {result.ledger_duplicates}; "
         f"/healthz: {result.healthz_status}")
    slow = [f.fault for f in result.faults if f.scheduling_resumed_s is None or f.scheduling_resumed_s > 10]
    echo(f"scheduling resumed within 10 s of every return: {'yes' if not slow else 'NO: ' + ', '.join(slow)}")
    echo("RESULT: " + ("ok" if result.ok else "FAILED"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m services.devstack.chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma separated, in order (default: {','.join(FAULTS)})")
    p.add_argument("--rate", type=float, default=10.0, help="submissions per second (default 10)")
    p.add_argument("--down", type=float, default=5.0, help="seconds a server stays down (default 5)")
    p.add_argument("--gap", type=float, default=5.0, help="seconds of steady flow between faults (default 5)")
    p.add_argument("--cluster-file", default=DEFAULT_CLUSTER_FILE)
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs of every process)")
    p.add_argument("--nats-cluster", type=int, default=0, metavar="N",
                   help="N nats-servers in a JetStream cluster, streams with 3 replicas; the nats fault "
                        "SIGKILLs the server leading the log stream (default: one server)")
    args = p.parse_args(argv)
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        p.error(f"unknown faults {unknown}; choose from {', '.join(FAULTS)}")
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("timeshare.bus").setLevel(logging.ERROR)  # the driver's own reconnects: expected
    workdir = tempfile.mkdtemp(prefix="timeshare-chaos-")
    chaos = Chaos(workdir, args.cluster_file, rate=args.rate, down_s=args.down, gap_s=args.gap,
                  nats_cluster=args.nats_cluster)
    print(f"chaos: work folder {workdir}; starting nats-server, PostgreSQL and every service ...", flush=True)
    chaos.start_servers()
    try:
        result = asyncio.run(chaos.run(faults))
    except BaseException:
        print(chaos.log_tails(), file=sys.stderr)
        raise
    finally:
        chaos.stop_all()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    report(result)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
