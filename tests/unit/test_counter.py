"""The example workload (examples/workloads/counter.py) as the process executor runs it: a real
process, SIGTERM with and without a notice, resumed from its checkpoint directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.executor.service import checkpoint_dir

COUNTER = Path(__file__).resolve().parents[2] / "examples" / "workloads" / "counter.py"


def start(ckpt: Path, attempt: int, notice_s: int, work: int = 40) -> subprocess.Popen:
    env = dict(os.environ, TIMESHARE_CHECKPOINT_DIR=str(ckpt), TIMESHARE_NOTICE_S=str(notice_s),
               TIMESHARE_ATTEMPT=str(attempt), TIMESHARE_RANK="0")
    return subprocess.Popen([sys.executable, str(COUNTER), "--work-s", str(work), "--step-s", "0.05",
                             "--checkpoint-every", "4"], env=env)


def record(ckpt: Path, attempt: int) -> dict:
    return json.loads((ckpt / f"attempt-{attempt}.json").read_text())


def stop_after(proc: subprocess.Popen, ckpt: Path, attempt: int, steps: int) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if record(ckpt, attempt)["step"] >= steps:
                break
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=10)


@pytest.mark.parametrize("notice_s, code, state, kept", [
    (90, 0, "checkpointed", "the step it reached"),
    (0, 128 + signal.SIGTERM, "stopped", "its last periodic checkpoint"),
], ids=["with a notice: SIGTERM means checkpoint now, exit 0", "without: SIGTERM means stop, the work since the "
        "periodic checkpoint is lost"])
def test_sigterm_and_resume(tmp_path, notice_s, code, state, kept):
    assert stop_after(start(tmp_path, 1, notice_s), tmp_path, 1, 6) == code
    first = record(tmp_path, 1)
    assert first["state"] == state and first["start_step"] == 0 and first["step"] >= 6
    resumed_from = json.loads((tmp_path / "counter.json").read_text())["step"]
    assert resumed_from == (first["step"] if notice_s else first["step"] // 4 * 4), kept
    # the next attempt resumes from the checkpoint and finishes the declared work
    assert start(tmp_path, 2, notice_s).wait(timeout=20) == 0
    second = record(tmp_path, 2)
    assert second["state"] == "done" and second["start_step"] == resumed_from and second["step"] == 40
    lost = first["step"] - resumed_from
    assert (first["step"] - first["start_step"]) + (second["step"] - second["start_step"]) == 40 + lost
    assert (lost == 0) == (notice_s > 0) or first["step"] % 4 == 0


@pytest.mark.parametrize("workload_id", ["", ".", "..", "a/b", "../x"])
def test_a_workload_id_that_is_not_one_path_segment_names_no_checkpoint_directory(workload_id):
    with pytest.raises(ValueError, match="cannot name a directory"):
        checkpoint_dir("/data", "c", workload_id)


def test_the_checkpoint_directory_is_per_cluster_and_workload():
    assert checkpoint_dir("/data", "c1", "w-1") == "/data/c1/checkpoints/w-1"
