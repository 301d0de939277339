"""Placement failover time as the log grows: full replay vs. snapshot + the rest, with and
without forgetting ended work.

    make bench-failover        # = .venv/bin/python benchmarks/bench_failover.py [--sizes 10000,100000]

For each size it generates a valid log of about that many events (the scheduling core itself
on the demo cluster: batches of 32 one- and two-GPU submissions 10 s of cluster time apart, the
pass's decisions, completions: about 35,000 events per hour of cluster time) and times, on a
fresh nats-server:

* ``full replay``: snapshots off, a new leader replays the whole log (the reference);
* for each retention of ended work (``never``: what placement did before it forgot anything;
  ``1 h``: the default TIMESHARE_FORGET_ENDED_AFTER_S; ``10 min``): a first leader replays the log
  but its last ``--tail`` events and writes a snapshot (forgetting first what ended more than
  the retention ago); the tail is appended (what follows a snapshot in a real failover: up to
  TIMESHARE_SNAPSHOT_EVERY events, half of it on average); a second leader loads the snapshot
  and replays the tail. Printed: the snapshot's size and the workloads it holds, the events
  replayed after it, the rebuild (load + replay, ``Placement.rebuild_s``) and the time from
  ``Placement.start()`` to leading (connect, streams, lease, rebuild).

A released lease is taken at once; a killed leader's successor waits the lease TTL on top.
Prints, never asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT)]

from services.common import subjects  # noqa: E402
from services.common.bus import Bus  # noqa: E402
from services.common.clock import make_clock  # noqa: E402
from services.common.cluster_config import load_cluster  # noqa: E402
from services.common.settings import DEFAULT_CLUSTER_FILE, Settings  # noqa: E402
from services.devstack.servers import NatsServer  # noqa: E402
from services.placement.service import Placement  # noqa: E402
from timeshare import events as ev  # noqa: E402
from timeshare.scheduler import BudgetPolicy  # noqa: E402
from timeshare.state import SchedulerState  # noqa: E402
from timeshare.workload import WorkloadSpec  # noqa: E402


def generate(config, cluster: str, n_events: int, gap_s: int = 10) -> list[ev.Event]:
    """A valid log: batches of 1-GPU submissions, a pass, then every running workload completes;
    a batch every ``gap_s`` of cluster time (10 s: about 35,000 events an hour)."""
    state = SchedulerState(config.tree(), config.cluster(), config.policy, name=cluster, id_prefix="gen-")
    policy = BudgetPolicy()
    leaves = sorted(config.tree().leaves)
    out: list[ev.Event] = []
    i = t_s = 0
    while len(out) < n_events:
        for _ in range(32):
            spec = WorkloadSpec(id=f"g{i}", submit_s=t_s, project=leaves[i % len(leaves)], gpu_type="H100",
                                gpus=1 + i % 2, work_s=10, min_runtime_s=0, resumable=True, user="bench")
            e = ev.WorkloadSubmitted(event_id=f"sub.g{i}", at_ms=t_s * 1000, cluster=cluster, workload=spec)
            state.apply(e)
            out.append(e)
            i += 1
        out += policy.schedule(state, t_s)  # applied by the core as it decides
        t_s += gap_s
        for wid in sorted(state.running):
            e = ev.WorkloadCompleted(event_id=f"done.{wid}.{state.workloads[wid].attempt}", at_ms=t_s * 1000,
                                     cluster=cluster, workload_id=wid, attempt=state.workloads[wid].attempt)
            state.apply(e)
            out.append(e)
    return out


async def write_log(bus: Bus, events: list[ev.Event]) -> None:
    for k in range(0, len(events), 2000):
        chunk = events[k:k + 2000]
        await asyncio.gather(*(bus.js.publish(subjects.log_subject(e.cluster, ev.event_type(e)), ev.encoder.encode(e),
                                              headers={"Nats-Msg-Id": f"{e.cluster}/{e.event_id}"}) for e in chunk))


async def lead(settings: Settings, config) -> tuple[float, Placement]:
    t0 = time.perf_counter()
    p = await Placement(settings, config, make_clock("manual")).start()
    return time.perf_counter() - t0, p


RETENTIONS = (("never", 0.0), ("1 h", 3600.0), ("10 min", 600.0))


async def fresh_log(nats, cluster: str, events: list[ev.Event], base: Settings) -> Bus:
    bus = await Bus.connect(replace(base, cluster=cluster), cluster, name="bench")
    await bus.ensure_infra()
    await write_log(bus, [msgspec.structs.replace(e, cluster=cluster) for e in events])
    return bus


async def run(sizes: list[int], snapshot_every: int, tail: int, gap_s: int) -> None:
    store = tempfile.mkdtemp(prefix="timeshare-bench-failover-")
    nats = NatsServer(store).start()
    config0 = load_cluster(DEFAULT_CLUSTER_FILE, "")
    print(f"placement failover vs log size (demo cluster, {sum(p.total_gpus for p in config0.cluster().pools.values())}"
          f" GPUs); the snapshot is followed by {tail:,} events")
    print("| events in the log (cluster time) | forget ended after | snapshot | workloads in it | replayed after it "
          "| rebuild | lead after |")
    print("|---|---|---|---|---|---|---|")
    try:
        for n in sizes:
            name = f"f{n}"
            base = Settings(nats_url=nats.url, nats_credentials=nats.credentials_file, database_url="memory",
                            cluster_file=DEFAULT_CLUSTER_FILE, cluster=name, clock="manual", lease_ttl_s=5.0,
                            log_level="WARNING", snapshot_every=0)
            events = generate(load_cluster(DEFAULT_CLUSTER_FILE, name), name, n, gap_s)
            span = f"{len(events):,} ({(events[-1].at_ms - events[0].at_ms) / 3.6e6:.1f} h)"
            # the reference: no snapshot, the whole log
            bus = await fresh_log(nats, name, events, base)
            full_s, p = await lead(base, load_cluster(DEFAULT_CLUSTER_FILE, name))
            print(f"| {span} | (no snapshot: full replay) | | {len(p.state.workloads):,} | {p.replayed:,} "
                  f"| {p.rebuild_s:.2f} s | {full_s:.2f} s |", flush=True)
            await p.stop()
            await bus.close()
            for label, after_s in RETENTIONS:
                cluster = f"{name}r{int(after_s)}"
                config = load_cluster(DEFAULT_CLUSTER_FILE, cluster)
                settings = replace(base, cluster=cluster, snapshot_every=snapshot_every, forget_ended_after_s=after_s)
                bus = await fresh_log(nats, cluster, events[:-tail], base)
                _, p = await lead(settings, config)  # replays it all, forgets, writes a snapshot
                while p.snapshot_task is not None and not p.snapshot_task.done():
                    await asyncio.sleep(0.05)
                held = len(p.state.workloads)
                await p.stop()
                await write_log(bus, [msgspec.structs.replace(e, cluster=cluster) for e in events[-tail:]])
                lead_s, p = await lead(settings, config)
                replayed, rebuild_s = p.replayed, p.rebuild_s
                await p.stop()
                obj = await (await bus.object_store(subjects.SNAPSHOT_BUCKET)).get(f"placement.{cluster}")
                print(f"| {span} | {label} | {len(obj.data) / 1e6:.2f} MB | {held:,} | {replayed:,} "
                      f"| {rebuild_s:.2f} s | {lead_s:.2f} s |", flush=True)
                await bus.close()
    finally:
        nats.stop()
        shutil.rmtree(store, ignore_errors=True)


def main() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("timeshare.bus").setLevel(logging.ERROR)  # each stop says "disconnected"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000", help="log sizes in events (default 10000,100000)")
    p.add_argument("--snapshot-every", type=int, default=5000)
    p.add_argument("--tail", type=int, default=2500, help="events appended after the snapshot (default 2500)")
    p.add_argument("--gap-s", type=int, default=10,
                   help="cluster seconds between batches of 32 submissions (default 10: about 35,000 events an "
                        "hour; 60: about 5,800)")
    args = p.parse_args()
    asyncio.run(run([int(x) for x in args.sizes.split(",")], args.snapshot_every, args.tail, args.gap_s))


if __name__ == "__main__":
    main()
