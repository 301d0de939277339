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
