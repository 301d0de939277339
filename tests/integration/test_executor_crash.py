"""The process executor killed with -9 (the operator's ``kill -9``, an OOM kill, a node agent
crash) leaves no workload running unsupervised, and its restart never runs a workload next to
its old processes (services/executor/processes.py). The executor runs as a separate process
(``python -m services.executor``) on real NATS JetStream and PostgreSQL; the other services run
in the test's process.

* A counter that declared a notice gets SIGTERM when the executor dies (the parent-death
  signal): it saves its step and exits; the restarted executor starts it again in the same
  attempt and it resumes from that step: nothing lost, never two at once.
* A process that ignores SIGTERM survives the executor's death; the restarted executor finds
  its record, stops its process group (SIGTERM, grace, SIGKILL) and only then starts the
  workload again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import pytest

from services.devstack.stack import Stack
from timeshare import events as ev

from .helpers import client, of_type, spawn_service, wait_events, wait_for
from .test_notice import COUNTER, records

pytestmark = pytest.mark.integration

OTHERS = ("placement", "budget", "ledger", "health", "gateway")

#: ignores SIGTERM; writes a file named by its pid holding the pids of earlier runs still alive
STUBBORN = """
import json, os, signal, sys, time
folder = sys.argv[1]
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
others = [int(n) for n in os.listdir(folder) if alive(int(n))]
with open(os.path.join(folder, f"{os.getpid()}.tmp"), "w") as f:
    json.dump(others, f)
os.replace(os.path.join(folder, f"{os.getpid()}.tmp"), os.path.join(folder, str(os.getpid())))
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_9(proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


async def test_a_counter_checkpoints_when_the_executor_is_killed_and_resumes_after_its_restart(
        make_settings, tmp_path):
    settings = make_settings(executor="process", executor_data_dir=str(tmp_path / "executor"), kill_grace_s=2.0)
    logs = tempfile.mkdtemp(prefix="timeshare-logs-")
    stack = await Stack(settings, services=OTHERS).start()
    record_dir = tmp_path / "records"
    ckpt = tmp_path / "executor" / settings.cluster / "checkpoints" / "counter" / "counter.json"
    procs = [spawn_service("executor", settings, f"{logs}/executor-1.log")]
    try:
        async with client(stack, "tok-alice") as alice:
            r = await alice.post("/v1/workloads", json={
                "id": "counter", "project": "alpha/train", "gpu_type": "H100", "gpus": 4, "work_s": 12,
                "min_runtime_s": 1, "resumable": True, "checkpoint_interval_s": 5, "checkpoint_on_notice_s": 20,
                "command": [sys.executable, str(COUNTER), "--work-s", "12", "--checkpoint-every", "5",
                            "--record-dir", str(record_dir)]})
            assert r.status_code == 202, r.text
            first = await wait_for(lambda: _at_step(record_dir, 3), timeout_s=30, interval_s=0.02,
                                   what="the counter at 3 steps")
            kill_9(procs[0])
            # the parent-death signal: SIGTERM, as a notice (it declared one): saved and gone
            done = await wait_for(lambda: _state(record_dir, "checkpointed"), timeout_s=10, interval_s=0.02,
                                  what="the counter to save its step after the executor died")
            await wait_for(lambda: _true(not alive(first["pid"])), timeout_s=5, what="the counter process to exit")
            saved = json.loads(ckpt.read_text())["step"]
            assert saved == done["step"] >= 3 and done["pid"] == first["pid"]

            procs.append(spawn_service("executor", settings, f"{logs}/executor-2.log"))
            events = await wait_events(stack["gateway"].bus, settings.cluster,
                                       lambda es: of_type(es, ev.WorkloadCompleted, "counter"), timeout_s=40,
                                       what="the counter to complete after the restart")
        again = records(record_dir)[1]  # the same attempt, started again from the saved step
        assert again["pid"] != first["pid"] and again["start_step"] == saved and again["step"] == 12
        assert again["state"] == "done"
        assert len(of_type(events, ev.WorkloadStarted, "counter")) == 1  # one attempt: nothing redone
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(15)
        await stack.stop()


async def test_a_process_that_outlives_a_killed_executor_is_stopped_before_the_work_starts_again(
        make_settings, tmp_path):
    settings = make_settings(executor="process", executor_data_dir=str(tmp_path / "executor"), kill_grace_s=1.0)
    logs = tempfile.mkdtemp(prefix="timeshare-logs-")
    stack = await Stack(settings, services=OTHERS).start()
    runs = tmp_path / "runs"
    runs.mkdir()
    records_dir = tmp_path / "executor" / settings.cluster / "processes"
    procs = [spawn_service("executor", settings, f"{logs}/executor-1.log")]
    seen: list[int] = []
    try:
        async with client(stack, "tok-alice") as alice:
            r = await alice.post("/v1/workloads", json={
                "id": "stubborn", "project": "alpha/train", "gpu_type": "H100", "gpus": 4, "work_s": 600,
                "command": [sys.executable, "-c", STUBBORN, str(runs)]})
            assert r.status_code == 202, r.text
            seen[:] = await wait_for(lambda: _runs(runs, 1), timeout_s=20, what="the first run")
            (old,) = seen
            assert json.loads((runs / str(old)).read_text()) == []
            assert (records_dir / f"{old}.json").exists()
            kill_9(procs[0])
            await asyncio.sleep(1.0)
            assert alive(old)  # it ignored the parent-death SIGTERM: left running, unsupervised

            procs.append(spawn_service("executor", settings, f"{logs}/executor-2.log"))
            both = await wait_for(lambda: _runs(runs, 2), timeout_s=30, what="the run after the restart")
            seen[:] = both
            (new,) = set(both) - {old}
            assert not alive(old)  # stopped (SIGKILL after the grace: it ignores SIGTERM)
            assert json.loads((runs / str(new)).read_text()) == []  # nothing of the old run was alive at its start
            assert sorted(p.name for p in records_dir.iterdir()) == [f"{new}.json"]
            log = Path(f"{logs}/executor-2.log").read_text()
            assert f"process group {old} of stubborn" in log, log[-2000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(15)
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        await stack.stop()


async def _true(value):
    return value


async def _at_step(record_dir: Path, step: int):
    doc = records(record_dir).get(1)
    return doc if doc and doc["step"] >= step else None


async def _state(record_dir: Path, state: str):
    doc = records(record_dir).get(1)
    return doc if doc and doc["state"] == state else None


async def _runs(folder: Path, n: int):
    pids = sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())
    return pids if len(pids) >= n else None
