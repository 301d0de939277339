"""The CLI's `whoami`, `queue --mine`, `workloads --mine` and `nodes cordon` against a live gateway."""

from __future__ import annotations

import json

import pytest

from timeshare import events as ev

from .helpers import log_events, of_type, wait_events
from .test_cli import timeshare

pytestmark = pytest.mark.integration


async def test_mine_is_the_tokens_user_and_cordon_takes_a_node_out_of_service(stack):
    cluster, bus = stack.settings.cluster, stack["gateway"].bus
    r = await timeshare(stack, "tok-alice", "whoami")
    assert r.returncode == 0 and r.stdout.strip() == "alice (manages alpha)", r.stdout + r.stderr
    # both nodes busy with protected work, then one more of alice's and one of bob's wait
    for token, project, wid in (("tok-alice", "alpha/train", "a-run"), ("tok-bob", "beta/debug", "b-run"),
                                ("tok-alice", "alpha/train", "a-wait"), ("tok-bob", "beta/debug", "b-wait")):
        r = await timeshare(stack, token, "submit", "--project", project, "--gpus", "4", "--work", "1h",
                            "--min-runtime", "30m", "--json")
        assert r.returncode == 0, r.stderr
    await wait_events(bus, cluster, lambda es: len(of_type(es, ev.WorkloadSubmitted)) == 4
                      and len(of_type(es, ev.WorkloadStarted)) == 2)
    r = await timeshare(stack, "tok-alice", "queue", "--mine", "--json")
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert body["pending"] == 2 and [w["user"] for w in body["workloads"]] == ["alice"]
    r = await timeshare(stack, "tok-bob", "workloads", "--mine", "--json")
    assert r.returncode == 0, r.stderr
    assert {w["user"] for w in json.loads(r.stdout)["workloads"]} == {"bob"}
    assert len(json.loads(r.stdout)["workloads"]) == 2
    r = await timeshare(stack, "tok-alice", "queue", "--mine", "--user", "bob")
    assert r.returncode == 2 and "not allowed with argument" in r.stderr

    r = await timeshare(stack, "tok-carol", "nodes", "cordon", "H100-000", "--reason", "XID 79")
    assert r.returncode == 1 and "403" in r.stderr
    r = await timeshare(stack, "tok-admin", "nodes", "cordon", "H100-000")
    assert r.returncode == 2 and "--reason" in r.stderr  # the reason is required
    r = await timeshare(stack, "tok-admin", "nodes", "cordon", "H100-000", "--reason", "XID 79")
    assert r.returncode == 0 and r.stdout.startswith("H100-000: cordoning"), r.stdout + r.stderr
    events = await wait_events(bus, cluster, lambda es: of_type(es, ev.NodeUnhealthy))
    (unhealthy,) = of_type(events, ev.NodeUnhealthy)
    assert unhealthy.node == "H100-000" and unhealthy.reason == "XID 79"
    r = await timeshare(stack, "tok-admin", "nodes", "cordon", "H100-404", "--reason", "x")
    assert r.returncode == 1 and "404" in r.stderr
    # protected work is not preempted by the cordon: it drains at its minimum runtime
    assert not of_type(await log_events(bus, cluster), ev.WorkloadPreempted)


async def test_uncordon_takes_back_a_mistaken_cordon_and_the_node_takes_work_again(stack):
    cluster, bus = stack.settings.cluster, stack["gateway"].bus
    r = await timeshare(stack, "tok-admin", "nodes", "uncordon", "H100-000")
    assert r.returncode == 1 and r.stderr == ("timeshare: 409: node H100-000 is healthy; only a cordoned or drained "
                                              "node can be uncordoned (it is in service)\n"), r.stderr
    r = await timeshare(stack, "tok-admin", "nodes", "cordon", "H100-000", "--reason", "a typo: meant H100-010")
    assert r.returncode == 0, r.stderr
    await wait_events(bus, cluster, lambda es: of_type(es, ev.NodeUnhealthy))
    r = await timeshare(stack, "tok-carol", "nodes", "uncordon", "H100-000")
    assert r.returncode == 1 and r.stderr.startswith("timeshare: 403: only admins uncordon nodes"), r.stderr
    r = await timeshare(stack, "tok-admin", "nodes", "uncordon", "H100-000")
    assert r.returncode == 0 and r.stdout.startswith("H100-000: back in service"), r.stdout + r.stderr
    events = await wait_events(bus, cluster, lambda es: of_type(es, ev.NodeRepaired))
    assert [e.node for e in of_type(events, ev.NodeRepaired)] == ["H100-000"]
    # both nodes take work again: two whole-node workloads start at once
    for _ in range(2):
        r = await timeshare(stack, "tok-carol", "submit", "--project", "alpha/train", "--gpus", "4", "--work", "1h",
                            "--json")
        assert r.returncode == 0, r.stderr
    events = await wait_events(bus, cluster, lambda es: len(of_type(es, ev.WorkloadStarted)) == 2)
    assert sorted(p.node for e in of_type(events, ev.WorkloadStarted) for p in e.placement) == ["H100-000", "H100-001"]
    r = await timeshare(stack, "tok-admin", "nodes", "--json")
    assert {n["name"]: n["state"] for n in json.loads(r.stdout)["nodes"]} == {"H100-000": "healthy",
                                                                              "H100-001": "healthy"}


async def test_workloads_state_preempted_holds_requeued_work_and_preempted_is_at_least_once(stack):
    """Unallocated work of carol's fills the cluster; alice's funded gang takes a node: the victim
    is requeued (pending again), so ``--state preempted`` and ``--preempted`` list it, and
    ``--state pending`` too; a state the gateway does not know is refused by it (422) and by the
    CLI before anything is sent (exit 2)."""
    cluster, bus = stack.settings.cluster, stack["gateway"].bus
    for _ in range(2):
        r = await timeshare(stack, "tok-carol", "submit", "--project", "beta/debug", "--gpus", "4", "--work", "1h",
                            "--resumable", "--json")
        assert r.returncode == 0, r.stderr
    await wait_events(bus, cluster, lambda es: len(of_type(es, ev.WorkloadStarted)) == 2)
    r = await timeshare(stack, "tok-alice", "submit", "--project", "alpha/train", "--gpus", "4", "--work", "1h",
                        "--min-runtime", "30m", "--json")
    assert r.returncode == 0, r.stderr
    events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadRequeued)
                               and len(of_type(es, ev.WorkloadStarted)) == 3)
    (victim,) = {e.workload_id for e in of_type(events, ev.WorkloadRequeued)}

    async def ids(*argv: str) -> list[str]:
        r = await timeshare(stack, "tok-admin", "workloads", *argv, "-q")
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert await ids("--state", "preempted") == [victim]
    assert await ids("--preempted") == [victim]
    assert await ids("--state", "pending", "--preempted") == [victim]
    assert victim not in await ids("--state", "running")
    r = await timeshare(stack, "tok-admin", "workloads", "--state", "bogus")
    assert r.returncode == 2 and r.stderr.startswith("timeshare: argument --state: invalid choice: 'bogus'")
    import httpx

    async with httpx.AsyncClient(base_url=stack["gateway"].url, headers={"Authorization": "Bearer tok-admin"}) as http:
        answer = await http.get("/v1/workloads", params={"state": "bogus"})
    assert answer.status_code == 422 and "preempted" in answer.text
