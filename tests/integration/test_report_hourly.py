"""The ledger's report reads hourly rows, and equals the report computed from the raw journal.

The reference is ``services.ledger.report.attainment_report`` (the collector fed every event of
the journal, what the ledger did on every call before the rows). The events are the
simulator's own (a scenario spanning hours), fed to a real ``Ledger`` (in-memory store), whose
rows are written as in service; the report is asked for several ranges."""

from __future__ import annotations

import types

import pytest

from services.common.clock import ManualClock
from services.common.cluster_config import load_cluster
from services.common.settings import Settings
from services.common.store import Changes
from services.ledger.report import attainment_report
from services.ledger import service as service_module
from services.ledger.service import Ledger
from timeshare import events as ev
from timeshare.sim.engine import run
from timeshare.sim.metrics import HOUR_S
from timeshare.sim.scenario import load_scenario

from .conftest import DATA

SCENARIO = DATA / "parity.toml"


def raw_report(ledger: Ledger, events: list[ev.Event], from_s, to_s) -> dict:
    nodes = {n.name: (p.gpu_type, n.gpus) for p in ledger.cluster_model.pools.values() for n in p.nodes}
    return attainment_report(events, ledger.tree, ledger.pool_gpus, nodes, ledger.config.policy.max_min_runtime_s,
                             from_s, to_s)


def attainment_part(report: dict) -> dict:
    return {"teams": report["teams"], "attainment": report["attainment"],
            "attainment_all_work": report["attainment_all_work"]}


@pytest.fixture
async def fed_ledger():
    scenario = load_scenario(SCENARIO)
    events: list[ev.Event] = []
    run(scenario, "budget", on_event=events.append)
    end_ms = events[-1].at_ms
    settings = Settings(database_url="memory", cluster_file=str(SCENARIO), cluster="parity")
    config = load_cluster(SCENARIO, "parity")
    ledger = Ledger(settings, config, ManualClock(end_ms))
    await ledger.store.open()
    # as the projector does: events folded batch by batch, rows written now and then
    for i in range(0, len(events), 7):
        batch = events[i:i + 7]
        ledger.committed({"events": list(batch), "checkpoint": None}, [(0, e) for e in batch])
        ledger.projector = types.SimpleNamespace(applied_seq=i + len(batch))
        if i % 21 == 0:
            await ledger.write_hourly_rows()
    yield ledger, events
    await ledger.store.close()


async def test_the_report_from_hourly_rows_equals_the_one_from_the_raw_journal(fed_ledger):
    ledger, events = fed_ledger
    first_s, last_s = events[0].at_ms / 1000, events[-1].at_ms / 1000
    assert last_s - first_s > 2 * HOUR_S  # the scenario spans hours: rows, not just the open hour
    await ledger.write_hourly_rows()
    stored = await ledger.store.scan("hourly")
    assert len(stored) == 2 and not ledger.hourly.unwritten  # two complete hours, the third open
    ranges = [(None, None), (None, last_s), (first_s + 1800, 2 * HOUR_S), (HOUR_S, 2 * HOUR_S),
              (first_s + 4000, last_s + 600), (0, HOUR_S)]
    for from_s, to_s in ranges:
        got = await ledger.report(from_s, to_s)
        assert "error" not in got, (from_s, to_s, got)
        want = raw_report(ledger, events, from_s, to_s if to_s is not None else max(ledger.clock.now_ms(),
                                                                                      ledger.last_ms) / 1000)
        assert attainment_part(got) == attainment_part(want), (from_s, to_s)
        assert any(t["owed_gpu_hours"] for t in got["teams"].values())
        if from_s is None:  # over the whole journal the range's counts are the journal's
            for field in ("occupancy", "unallocated_share", "preemptions", "preemptions_by_reason"):
                assert got[field] == want[field], field


async def test_a_range_ending_inside_a_complete_hour_is_refused_and_nothing_changes(fed_ledger):
    ledger, events = fed_ledger
    first_s = events[0].at_ms / 1000
    inside = (int(first_s // HOUR_S) + 1) * HOUR_S + 600  # in the second hour, long complete
    before = dict(ledger.hourly.unwritten)
    out = await ledger.report(None, inside)
    assert out["status"] == 400 and "whole hour" in out["error"]
    assert ledger.hourly.unwritten == before
    assert (await ledger.report(first_s, first_s - 1))["status"] == 400


async def test_a_leap_of_event_time_is_not_binned_hour_by_hour():
    """An event stamped at the epoch, then the wall clock (the poison test proposes at_ms=0):
    binning the 495,000 hours between took minutes and gigabytes; they get no rows."""
    from timeshare.workload import WorkloadSpec

    settings = Settings(database_url="memory", cluster_file=str(SCENARIO), cluster="parity")
    config = load_cluster(SCENARIO, "parity")
    now_ms = 1_764_590_400_000 + 1_800_000  # 2025-12-01 12:30 UTC
    ledger = Ledger(settings, config, ManualClock(now_ms))
    await ledger.store.open()
    spec = WorkloadSpec(id="w", submit_s=0, project="alpha/train", gpu_type="H100", gpus=1, work_s=60,
                        min_runtime_s=0, resumable=True)
    events = [ev.WorkloadSubmitted(event_id="s", at_ms=0, cluster="parity", workload=spec),
              ev.WorkloadCancelled(event_id="c", at_ms=now_ms - 600_000, cluster="parity", workload_id="w")]
    t0 = __import__("time").perf_counter()
    ledger.committed({"events": events, "checkpoint": None}, [(1, e) for e in events])
    ledger.projector = types.SimpleNamespace(applied_seq=2)
    assert await ledger.write_hourly_rows() <= 2
    assert __import__("time").perf_counter() - t0 < 5
    out = await ledger.report(now_ms / 1000 - 7200, None)
    assert "error" not in out, out
    assert (await ledger.report(None, None))["status"] == 400  # the journal spans > 400 days: give from_s
    await ledger.store.close()


async def feed(ledger: Ledger, events: list[ev.Event], batch: int = 7) -> None:
    """The events through the projection as the runner stores them: begin, fold, commit, committed."""
    for i in range(0, len(events), batch):
        part = [(i + k + 1, e) for k, e in enumerate(events[i:i + batch])]
        work = await ledger.begin(ledger.store, part)
        changes = Changes()
        for seq, e in part:
            work = ledger.fold(work, seq, e, changes)
        assert await ledger.store.commit(ledger.consumer, part[-1][0], changes)
        ledger.committed(work, part)
        ledger.projector = types.SimpleNamespace(applied_seq=part[-1][0])


@pytest.fixture(params=["memory", "postgresql"])
def store_server(request):
    """None (the in-memory store) or the throwaway PostgreSQL server."""
    return None if request.param == "memory" else request.getfixturevalue("postgres_server")


async def new_database(server) -> str:
    import uuid

    import asyncpg

    name = f"t_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(server.dsn)
    await conn.execute(f"CREATE DATABASE {name}")
    await conn.close()
    return server.dsn.rsplit("/", 1)[0] + f"/{name}"


async def test_a_restart_loads_the_checkpoint_and_folds_only_the_journal_after_it(monkeypatch, store_server):
    """A start used to fold the whole journal; it now takes the latest checkpoint and the rows
    after it, and ends in the same state: same usage, same report, same open rows."""
    import services.ledger.service as ledger_service

    monkeypatch.setattr(ledger_service, "CHECKPOINT_EVERY", 60)
    scenario = load_scenario(SCENARIO)
    events: list[ev.Event] = []
    run(scenario, "budget", on_event=events.append)
    store_url = "memory" if store_server is None else await new_database(store_server)
    settings = Settings(database_url=store_url, cluster_file=str(SCENARIO), cluster="parity")
    config = load_cluster(SCENARIO, "parity")
    clock = ManualClock(events[-1].at_ms)
    first = Ledger(settings, config, clock)
    await first.store.open()
    await feed(first, events)
    rows = first.journal_rows
    assert first.checkpoint_rows > 0 and rows - first.checkpoint_rows < 60 + 7
    await first.write_hourly_rows()

    again = Ledger(settings, config, clock, store=first.store)
    await again.load(first.store)
    again.projector = first.projector
    assert again.stats["folded_at_start"] == rows - first.checkpoint_rows < rows
    assert again.journal_rows == rows
    assert again.usage_snapshot() == first.usage_snapshot()
    for from_s, to_s in [(None, None), (HOUR_S, 2 * HOUR_S)]:
        assert await again.report(from_s, to_s) == await first.report(from_s, to_s)
    # ended workloads are forgotten: the collector holds the live ones only
    live = {w for w in first.hourly.mc.specs}
    assert live == set(again.hourly.mc.specs)
    assert len(live) < sum(isinstance(e, ev.WorkloadSubmitted) for e in events)

    # a checkpoint from other code is not trusted: the whole journal is folded, same state
    doc = await first.store.get("checkpoint", "parity")
    changes = Changes()
    changes.put("checkpoint", "parity", {**doc, "code": "other"})
    await first.store.commit("test-overwrite", 1, changes)
    cold = Ledger(settings, config, clock, store=first.store)
    await cold.load(first.store)
    cold.projector = first.projector
    assert cold.stats["folded_at_start"] == rows
    assert cold.usage_snapshot() == first.usage_snapshot()
    assert await cold.report(None, None) == await first.report(None, None)
    await first.store.close()


async def test_the_series_adds_up_to_the_report_hour_by_hour_for_every_tree_node(fed_ledger):
    ledger, events = fed_ledger
    first_s, last_s = events[0].at_ms / 1000, events[-1].at_ms / 1000
    await ledger.write_hourly_rows()
    hours = int(-(-last_s // HOUR_S)) - int(first_s // HOUR_S)
    for from_s, to_s in [(None, None), (first_s + 1800, 2 * HOUR_S), (HOUR_S, last_s)]:
        report = await ledger.report(from_s, to_s)
        for node in ["", *sorted(ledger.tree.nodes)]:
            leaves = [t for t in ledger.tree.leaves if not node or t == node or t.startswith(node + "/")]
            want_owed = sum(report["teams"][t]["owed_gpu_hours"] for t in leaves)
            want_got = sum(report["teams"][t]["delivered_gpu_hours"] for t in leaves)
            for bucket_h in (None, 2):
                series = await ledger.series(node, from_s, to_s, bucket_h)
                assert "error" not in series, series
                buckets = series["buckets"]
                assert [b["from_s"] % (HOUR_S * (bucket_h or 1)) for b in buckets] == [0] * len(buckets)
                # each team rounded to 1/1000 GPU-h per bucket
                slack = 0.0011 * len(leaves) * len(buckets)
                assert abs(sum(b["owed_gpu_hours"] for b in buckets) - want_owed) <= slack, (node, from_s, to_s)
                assert abs(sum(b["delivered_gpu_hours"] for b in buckets) - want_got) <= slack, (node, from_s, to_s)
                assert all(b["owed_gpu_hours"] <= b["entitled_gpu_hours"] + 0.001 for b in buckets)
    whole = await ledger.series("", None, None, None)
    assert len(whole["buckets"]) == hours and whole["bucket_s"] == HOUR_S
    assert any(b["owed_gpu_hours"] for b in whole["buckets"])


async def test_a_series_of_an_unknown_node_or_a_bad_range_is_refused(fed_ledger, monkeypatch):
    ledger, events = fed_ledger
    first_s = events[0].at_ms / 1000
    node = sorted(ledger.tree.nodes)[0]
    assert (await ledger.series("nobody/here", None, None, None))["status"] == 404
    assert (await ledger.series(node, first_s, first_s - 1, None))["status"] == 400
    assert (await ledger.series(node, None, None, 0))["status"] == 400
    future = await ledger.series(node, None, events[-1].at_ms / 1000 + 10 * HOUR_S, None)
    assert future["status"] == 400 and "future" in future["error"]
    # more points than a chart can show: the message names the bucket that fits (the journal
    # spans 3 hours; a limit of 2 points stands for 500 over a longer one)
    monkeypatch.setattr(service_module, "MAX_SERIES_POINTS", 2)
    far = await ledger.series(node, None, None, 1)
    assert far["status"] == 400 and "bucket_h of at least 2" in far["error"]
    assert len((await ledger.series(node, None, None, None))["buckets"]) == 2


async def test_the_report_shows_the_waste_of_the_preemptions_in_its_range():
    """Lost progress, checkpoint time and their total, as the simulator's metrics count them,
    over the hours of the range (the scenario with notices: both parts occur)."""
    path = DATA / "parity-notice.toml"
    scenario = load_scenario(path)
    events: list[ev.Event] = []
    sim = run(scenario, "budget", on_event=events.append)
    settings = Settings(database_url="memory", cluster_file=str(path), cluster="parity-notice")
    ledger = Ledger(settings, load_cluster(path, "parity-notice"), ManualClock(events[-1].at_ms))
    await ledger.store.open()
    await feed(ledger, events)
    await ledger.write_hourly_rows()
    preempted = [e for e in events if isinstance(e, ev.WorkloadPreempted)]
    lost_s = sum(e.lost_gpu_s for e in preempted)
    checkpoint_s = sum(e.checkpoint_gpu_s or 0 for e in preempted)
    assert lost_s > 0 and checkpoint_s > 0, (lost_s, checkpoint_s)

    got = await ledger.report(None, None)
    assert got["waste"]["lost_gpu_hours"] == round(lost_s / HOUR_S, 3)
    assert got["waste"]["checkpoint_gpu_hours"] == round(checkpoint_s / HOUR_S, 3)
    # the simulator's own figures over the same events, and the report from the raw journal
    assert got["wasted_gpu_hours"] == sim.metrics["wasted_gpu_hours"]
    assert {k: got["waste"][k] for k in ("lost_gpu_hours", "checkpoint_gpu_hours")} == \
        {k: sim.metrics["waste"][k] for k in ("lost_gpu_hours", "checkpoint_gpu_hours")}
    want = raw_report(ledger, events, None, max(ledger.clock.now_ms(), ledger.last_ms) / 1000)
    assert (got["wasted_gpu_hours"], got["waste"]) == (want["wasted_gpu_hours"], want["waste"])

    # hour by hour: the preemptions of each hour, and the hours add up to the whole
    first_h, last_h = int(events[0].at_ms // 1000 // HOUR_S), int(events[-1].at_ms // 1000 // HOUR_S)
    total_lost = 0.0
    for h in range(first_h, last_h + 1):
        part = await ledger.report(h * HOUR_S, (h + 1) * HOUR_S)
        in_hour = [e for e in preempted if h * HOUR_S <= e.at_ms / 1000 < (h + 1) * HOUR_S]
        assert part["waste"]["lost_gpu_hours"] == round(sum(e.lost_gpu_s for e in in_hour) / HOUR_S, 3), h
        assert part["waste"]["checkpoint_gpu_hours"] == \
            round(sum(e.checkpoint_gpu_s or 0 for e in in_hour) / HOUR_S, 3), h
        total_lost += sum(e.lost_gpu_s for e in in_hour)
    assert total_lost == lost_s
    await ledger.store.close()
