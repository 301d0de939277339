"""The CLI against a live gateway (a real subprocess of ``timeshare``)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


async def timeshare(stack, token: str, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TIMESHARE_URL=stack["gateway"].url, TIMESHARE_TOKEN=token,
               PYTHONPATH=f"{ROOT / 'shared'}:{ROOT}")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "timeshare.cli", *argv, env=env,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await proc.communicate()
    return subprocess.CompletedProcess(argv, proc.returncode, out.decode(), err.decode())


async def test_cli_submit_status_queue_budget_and_errors(stack):
    r = await timeshare(stack, "tok-alice", "submit", "--project", "alpha/train", "--gpus", "4", "--work", "1h",
                        "--min-runtime", "10m", "--json")
    assert r.returncode == 0, r.stderr
    wid = json.loads(r.stdout)["workload_id"]
    for _ in range(50):
        r = await timeshare(stack, "tok-alice", "status", wid)
        if r.returncode == 0 and "running" in r.stdout:
            break
        await asyncio.sleep(0.1)
    assert "running" in r.stdout and "workload.started" in r.stdout
    r = await timeshare(stack, "tok-alice", "explain", wid)  # placement's explanation, through the gateway
    assert r.returncode == 0, r.stderr
    assert "Running on allocated time, protected for" in r.stdout and "alpha/train: runs 4 of" in r.stdout
    r = await timeshare(stack, "tok-alice", "budget", "set", "beta/debug=3", "--reason", "not mine")
    assert r.returncode == 1 and "403" in r.stderr and "alice manages alpha" in r.stderr
    r = await timeshare(stack, "tok-admin", "budget", "set", "beta=2", "--reason", "grow beta")
    assert r.returncode == 0 and "beta: 1.0 -> 2.0" in r.stdout
    r = await timeshare(stack, "tok-admin", "budget", "show")
    assert r.returncode == 0 and "beta" in r.stdout
    r = await timeshare(stack, "tok-admin", "queue")
    assert r.returncode == 0 and "0 pending" in r.stdout
    r = await timeshare(stack, "tok-alice", "budget", "report", "--from", "1h")  # the ledger's real answer as a table
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("GPU-hours owed and delivered, 20") and "\nalpha/train " in r.stdout
    assert "fleet attainment" in r.stdout
    assert "\nwasted 0.00 GPU-h: lost progress 0.00, checkpoints on notice 0.00 " in r.stdout  # nothing preempted
    r = await timeshare(stack, "tok-admin", "nodes", "--json")
    assert {n["name"] for n in json.loads(r.stdout)["nodes"]} == {"H100-000", "H100-001"}
    r = await timeshare(stack, "tok-carol", "cancel", wid)
    assert r.returncode == 1 and "403" in r.stderr
    r = await timeshare(stack, "tok-alice", "cancel", wid)
    assert r.returncode == 0, r.stderr
    # the notice part of the contract: above the policy's max_notice (300 s) the gateway refuses it
    # naming the field; within it the workload carries it
    r = await timeshare(stack, "tok-alice", "submit", "--project", "alpha/train", "--gpus", "4", "--work", "1h",
                        "--resumable", "--checkpoint-on-notice", "6min")
    assert r.returncode == 1 and r.stderr.startswith("timeshare: 422: checkpoint_on_notice_s: 360s is above the "
                                                     "policy's max_notice of 300s"), r.stderr
    r = await timeshare(stack, "tok-alice", "submit", "--project", "alpha/train", "--gpus", "4", "--work", "1h",
                        "--resumable", "--checkpoint-every", "10min", "--checkpoint-on-notice", "90s",
                        "--checkpoint-gb", "40", "--suspends-on-notice", "-q")
    assert r.returncode == 0, r.stderr
    wid = r.stdout.strip()
    for _ in range(50):
        r = await timeshare(stack, "tok-alice", "status", wid, "--json")
        if r.returncode == 0:
            break
        await asyncio.sleep(0.1)
    spec = json.loads(r.stdout)["spec"]
    assert (spec["checkpoint_interval_s"], spec["checkpoint_on_notice_s"], spec["checkpoint_gb"],
            spec["suspends_on_notice"]) == (600, 90, 40.0, True)
