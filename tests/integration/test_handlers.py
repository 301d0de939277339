"""The services' request/reply handlers in memory, on faststream's ``TestNatsBroker``.

These run each service's real router (``services/<name>/handlers.py``) with the service
object behind it but no NATS server: the decoding (msgspec), the replies, the refusals of bad
input and the standby's silence. They are in addition to the real-server tests (test_flow,
test_policies, test_parity, ... go through the same handlers on a real nats-server), not
instead of them; they need no server, so they are not marked ``integration``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest
from faststream.nats import TestNatsBroker

from services.common import subjects
from services.common.broker import make_broker
from services.common.clock import ManualClock
from services.common.cluster_config import load_cluster
from services.common.settings import Settings

DATA = Path(__file__).parent / "data"
CLUSTER = "hnd"


@pytest.fixture
def settings():
    return Settings(nats_url="nats://127.0.0.1:1", database_url="memory", cluster_file=str(DATA / "small.toml"),
                    cluster=CLUSTER, heartbeat_timeout_s=0)


@pytest.fixture
def config(settings):
    return load_cluster(settings.cluster_file, CLUSTER)


async def ask(br, subject: str, body) -> dict:
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    reply = await br.request(data, subject, timeout=2)
    return json.loads(reply.body)


def cmd(name: str) -> str:
    return subjects.cmd_subject(CLUSTER, name)


def query(name: str) -> str:
    return subjects.query_subject(CLUSTER, name)


async def test_budget_set_refuses_bad_input_with_a_status_and_changes_nothing(settings, config):
    from services.budget.handlers import router
    from services.budget.service import Budget

    budget = Budget(settings, config, ManualClock(1_000))
    before = budget.tree.shares()
    broker = make_broker(settings, "budget", router(budget, CLUSTER))
    bob = {"user": "bob", "manages": ["beta"]}
    async with TestNatsBroker(broker) as br:
        out = await ask(br, cmd("budget.set"), {"caller": bob, "shares": {"alpha/train": 3}, "reason": "mine",
                                                "request_id": "r1"})
        assert out["status"] == 403 and "may not change alpha/train" in out["error"]
        out = await ask(br, cmd("budget.set"), {"caller": bob, "shares": {"beta/debug": 2}, "reason": " ",
                                                "request_id": "r2"})
        assert out["status"] == 400 and "reason" in out["error"]
        out = await ask(br, cmd("budget.set"), {"caller": bob, "shares": {}, "reason": "x", "request_id": "r3"})
        assert out == {"error": "no shares given", "status": 400}
        # the message itself is malformed: refused naming the field, not left unanswered
        out = await ask(br, cmd("budget.set"), {"caller": bob, "shares": {"beta/debug": 2}, "reason": "x"})
        assert out["status"] == 400 and "request_id" in out["error"], out
        out = await ask(br, cmd("budget.set"), {"caller": bob, "shares": {"beta/debug": "lots"}, "reason": "x",
                                                "request_id": "r4"})
        assert out["status"] == 400 and "malformed request" in out["error"], out
        out = await ask(br, cmd("budget.set"), b"not json at all")
        assert out["status"] == 400, out
    assert budget.tree.shares() == before


async def test_commands_are_strict_unknown_fields_and_wrong_types_refused(settings, config):
    """sec13's strict command bodies (services/common/commands.py) on the faststream handlers:
    an unknown field (a self-declared admin flag, a typo) or a value of the wrong type is a 400
    naming it, not silently dropped or coerced; nothing changes."""
    from services.budget.handlers import router as budget_router
    from services.budget.service import Budget
    from services.health.handlers import router as health_router
    from services.health.service import Health

    budget = Budget(settings, config, ManualClock(1_000))
    before = budget.tree.shares()
    admin = {"user": "root", "admin": True}
    async with TestNatsBroker(make_broker(settings, "budget", budget_router(budget, CLUSTER))) as br:
        out = await ask(br, cmd("budget.set"), {"caller": admin, "shares": {"alpha/train": 3}, "reason": "x",
                                                "request_id": "r1", "urgent": True})
        assert out["status"] == 400 and "urgent" in out["error"], out
        out = await ask(br, cmd("budget.set"), {"caller": {**admin, "superuser": True}, "shares": {"alpha/train": 3},
                                                "reason": "x", "request_id": "r2"})
        assert out["status"] == 400 and "superuser" in out["error"], out
        out = await ask(br, cmd("budget.set"), {"caller": admin, "shares": {"alpha/train": "3"}, "reason": "x",
                                                "request_id": "r3"})
        assert out["status"] == 400, out
        out = await ask(br, cmd("budget.remove"), {"caller": admin, "path": "alpha/train", "reason": "x",
                                                   "request_id": "r4", "force": True})
        assert out["status"] == 400 and "force" in out["error"], out
        out = await ask(br, cmd("budget.remove"), {"caller": admin, "path": "alpha/train", "reason": " ",
                                                   "request_id": "r5"})
        assert out["status"] == 400 and "reason" in out["error"], out
        out = await ask(br, cmd("budget.remove"), {"caller": {"user": "bob", "manages": ["beta"]},
                                                   "path": "alpha/train", "reason": "x", "request_id": "r6"})
        assert out["status"] == 403 and "may not remove alpha/train" in out["error"], out
    assert budget.tree.shares() == before

    health = Health(settings, config, ManualClock(5_000))
    node = health.node_names[0]
    async with TestNatsBroker(make_broker(settings, "health", health_router(health, CLUSTER))) as br:
        out = await ask(br, cmd("health.report"), {"node": node, "ok": "false"})
        assert out["status"] == 400 and "ok" in out["error"], out
        out = await ask(br, cmd("health.report"), {"node": node, "ok": False, "severity": "high"})
        assert out["status"] == 400 and "severity" in out["error"], out
        out = await ask(br, cmd("health.repaired"), {"node": node, "admin": True})
        assert out["status"] == 400 and "admin" in out["error"], out
        # a heartbeat with an unknown field is dropped (no reply to give): the node stays unseen
        await br.publish(msgspec.json.encode({"node": node, "extra": 1}), subjects.heartbeat_subject(CLUSTER))
        out = await ask(br, query("health.nodes"), {})
    assert out["nodes"][node].get("last_heartbeat_ms") is None
    assert all(n["state"] == "healthy" for n in out["nodes"].values())


async def test_budget_history_answers_from_the_store(settings, config):
    from services.budget.handlers import router
    from services.budget.service import Budget

    budget = Budget(settings, config, ManualClock(1_000))
    await budget.store.open()
    async with TestNatsBroker(make_broker(settings, "budget", router(budget, CLUSTER))) as br:
        out = await ask(br, query("budget.history"), {})
    assert out["cluster"] == CLUSTER and out["changes"] == []
    assert out["current"] == budget.tree.shares() and "alpha/train" in out["current"]


async def test_budget_history_keeps_what_changed_and_answers_a_page_at_a_time(settings, config):
    """A change of one share on a 10,000-leaf tree is one line of the history, not two copies of
    the tree; the answer is a page of the newest changes, oldest first, with where the page before
    starts; an entry written before the history kept only what changed still reads the same."""
    from services.budget.handlers import router
    from services.budget.service import Budget
    from services.common.store import Changes
    from timeshare import events as ev

    budget = Budget(settings, config, ManualClock(1_000))
    await budget.store.open()
    big = {f"t{i // 100}": 1.0 for i in range(0, 10_000, 100)} | {f"t{i // 100}/l{i % 100}": 1.0 for i in range(10_000)}
    changes = Changes()
    # (an entry as the budget service wrote it before: both whole maps)
    changes.append("history", CLUSTER, {"seq": 1, "event_id": "old-style", "at_ms": 1, "by": "root", "reason": "r1",
                                        "old": {"a": 1.0, "b": 2.0}, "new": {"a": 1.0, "b": 3.0, "c": 1.0}})
    work = {"tree": budget.tree, "seen": []}
    for seq in range(2, 6):
        new = {p: v for p, v in big.items() if not (seq == 5 and p == "t9/l9")} | {"t3/l7": float(seq)}
        # changes 2 and 3 as written before (both whole maps), 4 and 5 as now (only what changed)
        e = ev.BudgetChanged(event_id=f"e{seq}", at_ms=seq, cluster=CLUSTER, by="root", reason=f"r{seq}",
                             old=big, new=new) if seq < 4 else \
            ev.BudgetChanged(event_id=f"e{seq}", at_ms=seq, cluster=CLUSTER, by="root", reason=f"r{seq}",
                             changed=ev.share_changes(big, new))
        work = budget.fold(work, seq, e, changes)
    assert await budget.store.commit("budget", 5, changes)
    async with TestNatsBroker(make_broker(settings, "budget", router(budget, CLUSTER))) as br:
        everything = await ask(br, query("budget.history"), {})
        page = await ask(br, query("budget.history"), {"limit": 2})
        before = await ask(br, query("budget.history"), {"limit": 2, "before_seq": page["older_before_seq"]})
        bad = await ask(br, query("budget.history"), {"limit": 0})
    assert [h["reason"] for h in everything["changes"]] == ["r1", "r2", "r3", "r4", "r5"]
    assert everything["older_before_seq"] is None
    assert everything["changes"][0]["changed"] == {"b": {"old": 2.0, "new": 3.0}, "c": {"old": None, "new": 1.0}}
    assert "old" not in everything["changes"][0] and "new" not in everything["changes"][0]
    assert everything["changes"][2]["changed"] == {"t3/l7": {"old": 1.0, "new": 3.0}}
    assert everything["changes"][4]["changed"] == {"t3/l7": {"old": 1.0, "new": 5.0}, "t9/l9": {"old": 1.0, "new": None}}
    assert len(msgspec.json.encode(everything["changes"])) < 2_000  # five changes of a 10,100-node tree
    assert [h["reason"] for h in page["changes"]] == ["r4", "r5"] and page["older_before_seq"] == 4
    assert [h["reason"] for h in before["changes"]] == ["r2", "r3"] and before["older_before_seq"] == 2
    assert bad["status"] == 400 and "limit" in bad["error"], bad


async def test_health_commands_answer_unknown_nodes_404_and_wrong_states_409(settings, config):
    from services.health.handlers import router
    from services.health.service import Health

    health = Health(settings, config, ManualClock(5_000))
    node = health.node_names[0]
    async with TestNatsBroker(make_broker(settings, "health", router(health, CLUSTER))) as br:
        out = await ask(br, cmd("health.report"), {"node": "nope", "ok": False})
        assert out == {"error": "unknown node 'nope'", "status": 404}
        out = await ask(br, cmd("health.report"), {"node": node, "ok": True})
        assert out == {"node": node, "state": "healthy"}
        out = await ask(br, cmd("health.repaired"), {"node": node, "by": "root"})
        assert out["status"] == 409 and "only drained or down" in out["error"]
        out = await ask(br, cmd("health.report"), {"ok": False})
        assert out["status"] == 400 and "node" in out["error"]
        # a heartbeat has no reply; the node's last heartbeat is the clock's time
        await br.publish(msgspec.json.encode({"node": node}), subjects.heartbeat_subject(CLUSTER))
        out = await ask(br, query("health.nodes"), {})
    assert out["nodes"][node]["last_heartbeat_ms"] == 5_000
    assert all(n["state"] == "healthy" for n in out["nodes"].values())


async def test_ledger_report_refuses_ranges_it_cannot_serve(settings, config):
    from services.ledger.handlers import router
    from services.ledger.service import Ledger

    ledger = Ledger(settings, config, ManualClock(10 * 86400 * 1000))
    await ledger.store.open()
    async with TestNatsBroker(make_broker(settings, "ledger", router(ledger, CLUSTER))) as br:
        out = await ask(br, query("ledger.report"), {"from_s": 0, "to_s": 1e12})
        assert out["status"] == 400 and "future" in out["error"]
        out = await ask(br, query("ledger.report"), {"from_s": 100, "to_s": 50})
        assert out["status"] == 400 and "before" in out["error"]
        out = await ask(br, query("ledger.report"), {"from_s": "yesterday"})
        assert out["status"] == 400 and "from_s" in out["error"], out
        out = await ask(br, query("ledger.report"), {"from_s": 0, "to_s": 3600})
        assert out["attainment"] is not None or out["teams"], out
        usage = await ask(br, query("ledger.usage"), {})
        # the series refuses the same ranges, an unknown node, and a bucket of no hours
        out = await ask(br, query("ledger.series"), {"node": "alpha", "from_s": 100, "to_s": 50})
        assert out["status"] == 400 and "before" in out["error"]
        out = await ask(br, query("ledger.series"), {"node": "gamma"})
        assert out["status"] == 404 and "gamma" in out["error"]
        out = await ask(br, query("ledger.series"), {"node": "alpha", "bucket_h": 0})
        assert out["status"] == 400 and "bucket_h" in out["error"]
        out = await ask(br, query("ledger.series"), {"node": "alpha", "bucket_h": "an hour"})
        assert out["status"] == 400 and "bucket_h" in out["error"], out
        out = await ask(br, query("ledger.series"), {"node": "alpha"})
        assert out["node"] == "alpha" and out["buckets"] == [], out  # nothing happened yet
    assert usage["cluster"] == CLUSTER and "alpha/train" in usage["usage"]


async def test_executor_advance_with_nothing_running_completes_nothing(settings, config):
    from services.executor.handlers import router
    from services.executor.service import Executor

    executor = Executor(settings, config, ManualClock())
    async with TestNatsBroker(make_broker(settings, "executor", router(executor, CLUSTER))) as br:
        assert await ask(br, cmd("executor.advance"), {"now_ms": 60_000}) == {"completed": [], "log_seq": 0}
        out = await ask(br, cmd("executor.advance"), {"log_seq": 3})
        assert out["status"] == 400 and "now_ms" in out["error"]


async def test_placement_queries_are_answered_by_the_leader_only(settings, config):
    from services.placement.handlers import router
    from services.placement.service import Placement
    from timeshare.state import SchedulerState

    placement = Placement(settings, config, ManualClock(0))
    async with TestNatsBroker(make_broker(settings, "placement", router(placement, CLUSTER))) as br:
        # a standby's handler skips the message: nothing is published back (on a real server the
        # request gets the leader's answer; test_placement_standby_is_silent_on_a_real_server)
        reply = await br.request(b"{}", query("digest"), timeout=0.5)
        assert reply.body == b"", reply.body
        placement.state = SchedulerState(config.tree(), config.cluster(), config.policy, name=CLUSTER)
        placement.leader.set()
        digest = await ask(br, query("digest"), {})
        assert digest["instance"] == placement.instance and digest["digest"]
        out = await ask(br, query("queue"), {"limit": 10})
        assert out is not None and "status" not in out
        out = await ask(br, query("explain"), {"id": "nope"})
        assert out == {"error": "unknown workload 'nope'", "status": 404}
        out = await ask(br, query("queue"), {"limit": "ten"})
        assert out["status"] == 400 and "limit" in out["error"]


async def test_trace_is_answered_by_every_process_that_keeps_spans(settings, config, monkeypatch):
    """``trace`` is a scatter-gather (the gateway gathers every answer for 0.3 s): a standby
    placement answers it too, the executor answers, and a process without a span store sends
    nothing."""
    from services.common import telemetry
    from services.executor.handlers import router as executor_router
    from services.executor.service import Executor
    from services.placement.handlers import router as placement_router
    from services.placement.service import Placement

    class Store:
        def trace_of(self, cluster, workload_id):
            return {(CLUSTER, "w1"): "t1"}.get((cluster, workload_id))

        def spans_of(self, trace_id):
            return [{"span_id": "s1", "trace_id": trace_id}]

    placement = Placement(settings, config, ManualClock(0))  # a standby: not leading
    executor = Executor(settings, config, ManualClock())
    for broker in (make_broker(settings, "placement", placement_router(placement, CLUSTER)),
                   make_broker(settings, "executor", executor_router(executor, CLUSTER))):
        async with TestNatsBroker(broker) as br:
            monkeypatch.setattr(telemetry, "_store", None)
            reply = await br.request(b'{"workload_id": "w1"}', query("trace"), timeout=0.5)
            assert reply.body == b"", reply.body
            monkeypatch.setattr(telemetry, "_store", Store())
            assert await ask(br, query("trace"), {"workload_id": "w1", "trace_id": None}) == {
                "trace_id": "t1", "spans": [{"span_id": "s1", "trace_id": "t1"}]}
            assert await ask(br, query("trace"), {"workload_id": "w2"}) == {"trace_id": None, "spans": []}
            assert (await ask(br, query("trace"), {"trace_id": "t9"}))["trace_id"] == "t9"
            out = await ask(br, query("trace"), {"workload_id": 7})
            assert out["status"] == 400 and "workload_id" in out["error"]


@pytest.mark.integration
async def test_placement_standby_is_silent_on_a_real_server(make_settings):
    """Two placements on a real nats-server: every query gets the leader's answer (the standby
    sends nothing, not even an empty reply that could arrive first)."""
    from services.common.bus import Bus
    from services.placement.main import compose

    settings = make_settings(clock="manual")
    config = load_cluster(settings.cluster_file, settings.cluster)
    leader = await compose(settings, config, ManualClock())
    standby = await compose(settings, config, ManualClock(), wait_leader=False)
    bus = await Bus.connect(settings, settings.cluster, name="test")
    try:
        assert not standby.leader.is_set()
        for _ in range(20):
            msg = await bus.nc.request(subjects.query_subject(settings.cluster, "digest"), b"{}", timeout=2)
            assert json.loads(msg.data)["instance"] == leader.instance
        msg = await bus.nc.request(subjects.query_subject(settings.cluster, "healthz.placement"), b"{}", timeout=2)
        assert json.loads(msg.data)["leader"] == leader.instance
        # a malformed query is refused by the leader with the field named, not left to time out
        msg = await bus.nc.request(subjects.query_subject(settings.cluster, "workload"), b'{"idx": 1}', timeout=2)
        out = json.loads(msg.data)
        assert out["status"] == 400 and "id" in out["error"]
    finally:
        await bus.close()
        await standby.stop()
        await leader.stop()
