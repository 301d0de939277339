"""The ledger's report over a month: hourly rows against the raw journal (prints, never asserts).

    PYTHONPATH=shared:. .venv/bin/python benchmarks/bench_ledger_report.py [--days 30] [--memory]

Simulates the built-in ai2-like scenario (``--days`` of it), stores its events as the ledger's
journal in PostgreSQL (a throwaway server, as the tests start; ``--memory``: the in-memory
store), feeds them to a real ``Ledger`` (which writes its hourly rows), then times

* **rows**: ``Ledger.report`` (the hourly rows of the range from the store + the open hour);
* **journal**: what the ledger did before the rows on every call: load the whole journal from
  the store, decode it, fold it through the collector (``attainment_report``),

for the whole month and for its last week, checks the two give the same attainment numbers,
and prints the time, the peak memory each call added (tracemalloc) and the ratio. Then a
restart of the ledger: from its latest checkpoint and the journal after it, against the whole
journal (the checkpoint marked as other code's).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
import tracemalloc
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT)]

import msgspec  # noqa: E402

from services.common.clock import ManualClock  # noqa: E402
from services.common.cluster_config import load_cluster  # noqa: E402
from services.common.settings import Settings  # noqa: E402
from services.common.store import Changes, make_store  # noqa: E402
from services.ledger.report import attainment_report  # noqa: E402
from services.ledger.service import Ledger  # noqa: E402
from timeshare import events as ev  # noqa: E402
from timeshare.sim.engine import run  # noqa: E402
from timeshare.sim.scenario import load_scenario  # noqa: E402

SCENARIO = ROOT / "examples/ai2-like/scenario.toml"


async def timed(coro_fn):
    tracemalloc.start()
    t0 = time.perf_counter()
    out = await coro_fn()
    dt = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, dt, peak / 1e6


async def main_async(days: int, memory: bool) -> None:
    scenario = load_scenario(SCENARIO, {"duration": f"{days}d"})
    events: list[ev.Event] = []
    t0 = time.perf_counter()
    run(scenario, "budget", on_event=events.append)
    print(f"simulated {days} days of {scenario.name}: {len(events)} events in {time.perf_counter() - t0:.1f} s")

    pg = None
    if memory:
        dsn = "memory"
    else:
        from services.devstack.servers import PostgresServer

        pg = PostgresServer().start()
        dsn = pg.dsn
    try:
        settings = Settings(database_url=dsn, cluster_file=str(SCENARIO), cluster=scenario.name)
        config = load_cluster(SCENARIO, scenario.name)
        ledger = Ledger(settings, config, ManualClock(events[-1].at_ms), store=make_store(dsn, "ledger"))
        await ledger.store.open()
        t0 = time.perf_counter()
        batch = 2000
        for i in range(0, len(events), batch):  # as the projector runner stores a batch
            part = [(i + k + 1, e) for k, e in enumerate(events[i:i + batch])]
            work = await ledger.begin(ledger.store, part)
            changes = Changes()
            for seq, e in part:
                work = ledger.fold(work, seq, e, changes)
            await ledger.store.commit(ledger.consumer, part[-1][0], changes)
            ledger.committed(work, part)
            ledger.projector = types.SimpleNamespace(applied_seq=part[-1][0])
            await ledger.write_hourly_rows()
        print(f"journal + hourly rows stored ({'memory' if memory else 'PostgreSQL'}): "
              f"{time.perf_counter() - t0:.1f} s, {len(await ledger.store.scan('hourly'))} rows")

        nodes = {n.name: (p.gpu_type, n.gpus) for p in ledger.cluster_model.pools.values() for n in p.nodes}
        end_s = events[-1].at_ms / 1000

        async def from_journal(from_s, to_s):
            docs = await ledger.store.journal("events", ledger.cluster)
            evs = [ev.decoder.decode(msgspec.json.encode(d)) for d in docs]
            return attainment_report(evs, ledger.tree, ledger.pool_gpus, nodes,
                                     ledger.config.policy.max_min_runtime_s, from_s, to_s)

        print(f"{'range':<12} {'rows: time':>11} {'peak MB':>8} {'journal: time':>14} {'peak MB':>8} {'ratio':>7}  same")
        for name, from_s in (("whole", None), ("last 7 days", end_s - 7 * 86400)):
            got, t_rows, m_rows = await timed(lambda: ledger.report(from_s, None))
            want, t_journal, m_journal = await timed(lambda: from_journal(from_s, end_s))
            same = all(got[k] == want[k] for k in ("teams", "attainment", "attainment_all_work"))
            print(f"{name:<12} {t_rows:10.3f}s {m_rows:8.1f} {t_journal:13.3f}s {m_journal:8.1f} "
                  f"{t_journal / t_rows:7.1f}  {same}")

        # a restart: the latest checkpoint and the journal after it, against the whole journal
        print(f"{'ledger start':<30} {'rows folded':>11} {'time':>8} {'peak MB':>8}  same usage")
        for name, trusted in (("from its checkpoint", True), ("whole journal (no checkpoint)", False)):
            if not trusted:
                doc = await ledger.store.get("checkpoint", ledger.cluster)
                changes = Changes()
                changes.put("checkpoint", ledger.cluster, {**doc, "code": "not this code"})
                await ledger.store.commit("bench-overwrite", 1, changes)
            again = Ledger(settings, config, ManualClock(events[-1].at_ms), store=ledger.store)
            _, dt, peak = await timed(lambda: again.load(ledger.store))
            same = again.usage_snapshot() == ledger.usage_snapshot()
            print(f"{name:<30} {again.stats['folded_at_start']:>11} {dt:7.2f}s {peak:8.1f}  {same}")
        await ledger.store.close()
    finally:
        if pg is not None:
            pg.stop()
            shutil.rmtree(pg.data_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--memory", action="store_true", help="the in-memory store instead of PostgreSQL")
    args = p.parse_args(argv)
    asyncio.run(main_async(args.days, args.memory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
