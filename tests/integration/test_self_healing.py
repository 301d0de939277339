"""The live services heal themselves: servers restarted under a steady flow, a lost lease, a
stuck projection reported by /healthz. Real nats-server and PostgreSQL processes, restarted
for real (same store dir / data dir); no timed assertions (recovery times are printed)."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile

import httpx
import pytest

from services.common import subjects
from services.common.settings import Settings
from services.devstack.chaos import Chaos, report
from services.devstack.servers import PostgresServer, free_port
from services.devstack.stack import Stack
from tests.invariants import check_no_gpu_double_booked, check_protection

from .conftest import DATA, TOKENS
from timeshare import events as ev

from .helpers import client, log_events, wait_for

pytestmark = pytest.mark.integration


async def test_nats_postgres_and_service_kills_under_a_steady_flow_lose_and_duplicate_nothing():
    """The reduced `make chaos`: NATS and PostgreSQL restarted, the placement leader and the
    ledger killed with SIGKILL, each under a steady flow of HTTP submissions."""
    workdir = tempfile.mkdtemp(prefix="timeshare-chaos-test-")
    chaos = Chaos(workdir, str(DATA / "small.toml"), rate=4.0, down_s=2.0, gap_s=2.0, lease_ttl_s=2.0)
    chaos.start_servers()
    try:
        result = await chaos.run(["nats", "postgres", "placement", "ledger"])
    except BaseException:
        print(chaos.log_tails())  # CI keeps no files: what each process said last
        raise
    finally:
        chaos.stop_all()
    report(result)  # the numbers, for whoever reads the test log (-s)
    if result.ok:
        shutil.rmtree(workdir, ignore_errors=True)
    else:  # every process's log, for whoever investigates
        print(f"chaos logs kept in {workdir}")
        print(chaos.log_tails())
    assert result.accepted > 0 and [f.fault for f in result.faults] == ["nats", "postgres", "placement", "ledger"]
    for f in result.faults:  # each recovered by itself (the harness waits up to 120 s)
        assert f.scheduling_resumed_s is not None, f"scheduling never resumed after {f.fault}"
        assert f.projections_caught_up_s is not None, f"projections never caught up after {f.fault}"
    assert result.lost == [] and result.duplicated == [] and result.not_completed == []
    check_no_gpu_double_booked(result.events)
    check_protection(result.events)
    assert result.gateway_rows == {"completed": result.accepted}
    assert result.ledger_duplicates == 0
    assert result.healthz_status == 200, result.healthz


async def test_on_a_three_node_nats_cluster_killing_the_log_leader_loses_nothing_and_scheduling_goes_on():
    """Three nats-servers on loopback, streams with 3 replicas; the server leading the log stream
    is SIGKILLed under a steady flow and started again on its store."""
    workdir = tempfile.mkdtemp(prefix="timeshare-chaos-cluster-test-")
    chaos = Chaos(workdir, str(DATA / "small.toml"), rate=4.0, down_s=3.0, gap_s=2.0, lease_ttl_s=2.0,
                  nats_cluster=3)
    chaos.start_servers()
    try:
        result = await chaos.run(["nats"])
    except BaseException:
        print(chaos.log_tails())
        raise
    finally:
        chaos.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    report(result)
    assert result.accepted > 0 and result.faults[0].fault.endswith("(log leader, SIGKILL)")
    assert result.faults[0].scheduling_resumed_s is not None and result.faults[0].projections_caught_up_s is not None
    assert result.lost == [] and result.duplicated == [] and result.not_completed == []
    check_no_gpu_double_booked(result.events)
    assert result.gateway_rows == {"completed": result.accepted}
    assert result.healthz_status == 200, result.healthz


@pytest.fixture
def own_postgres():
    server = PostgresServer().start()
    yield server
    server.stop()
    shutil.rmtree(server.data_dir, ignore_errors=True)


async def test_healthz_names_a_projection_stuck_on_a_lost_database_and_recovers_with_it(nats_server, own_postgres,
                                                                                      cluster_name):
    import asyncpg

    conn = await asyncpg.connect(own_postgres.dsn)
    await conn.execute("CREATE DATABASE healing")
    await conn.close()
    settings = Settings(nats_url=nats_server.url, nats_credentials=nats_server.credentials_file, database_url=own_postgres.dsn.rsplit("/", 1)[0] + "/healing",
                        cluster_file=str(DATA / "small.toml"), cluster=cluster_name, http_port=free_port(),
                        tokens=json.dumps(TOKENS), lease_ttl_s=2.0, pass_interval_s=5.0, heartbeat_timeout_s=0,
                        stuck_after_s=1.0)
    stack = await Stack(settings).start()
    try:
        async with client(stack) as http:
            r = await http.get("/healthz")
            assert r.status_code == 200, r.json()
            assert set(r.json()["services"]) == {"gateway", "placement", "budget", "ledger", "health", "executor"}
            own_postgres.stop(mode="fast")  # pg_ctl stop -m fast, then start: a restart
            # a submission still reaches the log (placement needs no database); the gateway and
            # the ledger cannot store it and say so
            await stack["gateway"].bus.propose(_submission(cluster_name, "w-during"))

            async def stuck():
                r = await http.get("/healthz")
                services = r.json()["services"]
                both = (services["gateway"]["consumers"][f"gateway-{cluster_name}"]["stuck"]
                        and services["ledger"]["consumers"][f"ledger-{cluster_name}"]["stuck"])
                return r if r.status_code == 503 and both else None

            r = await wait_for(stuck, 30, what="/healthz to report the stuck projections")
            body = r.json()
            gw = body["services"]["gateway"]["consumers"][f"gateway-{cluster_name}"]
            assert gw["stuck"] and gw["state"] == "retrying" and gw["last_error"]
            assert body["services"]["ledger"]["consumers"][f"ledger-{cluster_name}"]["stuck"]
            assert not body["services"]["placement"]["consumers"]["inbox"]["stuck"]

            own_postgres.start()  # same data dir, same port

            async def healthy():
                r = await http.get("/healthz")
                return r if r.status_code == 200 else None

            await wait_for(healthy, 30, what="/healthz to be ok again")
            r = await wait_for(lambda: _known(http, "w-during"), 30, what="w-during in the gateway")
            assert r["id"] == "w-during"
            assert stack["gateway"].projector.status.errors > 0  # it did go through the outage
    finally:
        await stack.stop()


async def _known(http, wid):
    r = await http.get(f"/v1/workloads/{wid}")
    return r.json() if r.status_code == 200 else None


def _submission(cluster: str, wid: str):
    from timeshare import events as ev
    from timeshare.workload import WorkloadSpec

    spec = WorkloadSpec(id=wid, submit_s=0, project="alpha/train", gpu_type="H100", gpus=1, work_s=1,
                        min_runtime_s=0, resumable=True, user="carol")
    return ev.WorkloadSubmitted(event_id=f"sub.{wid}", at_ms=0, cluster=cluster, workload=spec)


async def test_a_leader_that_loses_its_lease_steps_down_and_campaigns_again(stack):
    placement = stack["placement"]
    assert placement.leader.is_set() and placement.terms == 1
    async with client(stack) as http:  # the first term decides something
        r = await http.post("/v1/workloads", json={"project": "alpha/train", "gpu_type": "H100", "gpus": 1,
                                                   "work_s": 1, "id": "w-before-lease"})
        assert r.status_code == 202
        await wait_for(lambda: _state(http, "w-before-lease", "completed"), 30, what="w-before-lease to complete")
    kv = await placement.bus.js.key_value(subjects.LEASE_BUCKET)
    key = f"placement.{stack.settings.cluster}"
    # another instance takes the lease (as after a long pause of this one)
    await kv.put(key, b"usurper")
    await wait_for(lambda: _is(placement.terms_lost == 1), 10, what="the leader to step down")
    assert not placement.leader.is_set()
    # the usurper vanishes: its lease lapses (deleted here); this instance campaigns and leads again
    await kv.delete(key)
    await wait_for(lambda: _is(placement.leader.is_set() and placement.terms == 2), 15,
                   what="placement to lead again")
    async with client(stack) as http:  # and it schedules
        r = await http.post("/v1/workloads", json={"project": "alpha/train", "gpu_type": "H100", "gpus": 1,
                                                   "work_s": 1, "id": "w-after-lease"})
        assert r.status_code == 202
        await wait_for(lambda: _state(http, "w-after-lease", "completed"), 30, what="w-after-lease to complete")
    # the second term's decisions have ids of their own (they once collided with the first
    # term's inside the dedup window: JetStream dropped them and the leader fenced itself out)
    events = await log_events(placement.bus, stack.settings.cluster)
    ids = [e.event_id for e in events]
    assert len(ids) == len(set(ids))
    started = [e for e in events if isinstance(e, ev.WorkloadStarted)]
    assert [e.workload_id for e in started] == ["w-before-lease", "w-after-lease"]


async def _is(value: bool) -> bool:
    await asyncio.sleep(0)
    return value


async def _state(http: httpx.AsyncClient, wid: str, state: str) -> bool:
    r = await http.get(f"/v1/workloads/{wid}")
    return r.status_code == 200 and r.json()["state"] == state
