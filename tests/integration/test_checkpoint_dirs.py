"""The process executor removes a workload's checkpoint directory once the workload has ended
for good, and an executor that was down when work ended removes those directories at its start
(real NATS, PostgreSQL, placement, and ``examples/workloads/counter.py`` as real processes).

The directory of work that is only preempted and requeued is kept (test_notice.py: each attempt
resumes from it, and it goes when the counter completes)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from services.devstack.stack import Stack
from timeshare import events as ev

from .helpers import client, of_type, wait_events, wait_for

pytestmark = pytest.mark.integration

COUNTER = Path(__file__).resolve().parents[2] / "examples" / "workloads" / "counter.py"


async def test_a_checkpoint_directory_goes_when_its_workload_ends_for_good_even_while_the_executor_was_down(
        make_settings, tmp_path):
    settings = make_settings(executor="process", executor_data_dir=str(tmp_path / "executor"), kill_grace_s=2.0)
    stack = await Stack(settings).start()
    cluster, bus = settings.cluster, stack["gateway"].bus
    root = tmp_path / "executor" / cluster / "checkpoints"
    records = tmp_path / "records"
    outside = tmp_path / "outside"  # a symlink in the checkpoints folder points here: never followed
    outside.mkdir()
    (outside / "keep.txt").write_text("not the executor's")
    try:
        async with client(stack, "tok-alice") as alice:
            for wid in ("cancelled-live", "cancelled-down"):
                r = await alice.post("/v1/workloads", json={
                    "id": wid, "project": "alpha/train", "gpu_type": "H100", "gpus": 4, "work_s": 600,
                    "min_runtime_s": 1, "resumable": True, "checkpoint_interval_s": 1,
                    "command": [sys.executable, str(COUNTER), "--work-s", "600", "--checkpoint-every", "1",
                                "--record-dir", str(records / wid)]})
                assert r.status_code == 202, r.text
            # both run and have written a checkpoint into their directories
            await wait_for(lambda: asyncio.sleep(0, all((root / w / "counter.json").exists()
                                                        for w in ("cancelled-live", "cancelled-down"))),
                           timeout_s=20, what="both counters to checkpoint")

            # 1. ended for good while the executor follows the log: removed once its process stopped
            assert (await alice.delete("/v1/workloads/cancelled-live")).status_code == 202
            await wait_for(lambda: asyncio.sleep(0, not (root / "cancelled-live").exists()), timeout_s=10,
                           what="the cancelled workload's directory removed")
            assert (root / "cancelled-down" / "counter.json").exists()  # still running: kept

            # 2. ended for good while the executor is down
            await stack.stop_service("executor")
            assert (await alice.delete("/v1/workloads/cancelled-down")).status_code == 202
            await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadCancelled, "cancelled-down"),
                              what="the cancellation in the log")
            # a live workload (running while the executor is down: no process, but its directory
            # must survive the sweep), a directory of an id the log never ended nor knows, and a
            # symlink to a folder outside
            r = await alice.post("/v1/workloads", json={
                "id": "live", "project": "alpha/train", "gpu_type": "H100", "gpus": 4, "work_s": 600,
                "min_runtime_s": 1, "resumable": True, "checkpoint_interval_s": 60})
            assert r.status_code == 202, r.text
            await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadStarted, "live"), what="live to start")
            (root / "live").mkdir()
            (root / "live" / "state.bin").write_bytes(b"resume from me")
            (root / "unknown").mkdir()
            (root / "link").symlink_to(outside, target_is_directory=True)
            (root / "stray-file").write_text("not a checkpoint directory: left alone")
            assert (root / "cancelled-down" / "counter.json").exists()

            await stack.start_service("executor")  # sweeps once caught up, before it is ready
            assert not (root / "cancelled-down").exists()
            assert not (root / "unknown").exists()
            assert not os.path.lexists(root / "link")
            assert (outside / "keep.txt").read_text() == "not the executor's"
            assert (root / "live" / "state.bin").read_bytes() == b"resume from me"
            assert (root / "stray-file").exists()
    finally:
        await stack.stop()
