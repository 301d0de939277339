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

from services.executor.checkpoints import checkpoints_root, remove_checkpoint_dir, stale_checkpoint_dirs
from services.executor.service import checkpoint_dir
from timeshare import events as ev

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


# -- removal once the workload has ended for good (services/executor/checkpoints.py) -----------

def _msg(**kw):
    return dict(event_id="e", at_ms=0, workload_id="w", **kw)


@pytest.mark.parametrize("event, for_good", [
    (lambda: ev.WorkloadCompleted(**_msg()), True),
    (lambda: ev.WorkloadFailed(**_msg(reason="exit code 1")), True),
    (lambda: ev.WorkloadCancelled(**_msg()), True),
    (lambda: ev.WorkloadPreempted(**_msg(reason=ev.PreemptionReason(kind="fair_share"), resumable=False,
                                         progress_s=0, lost_gpu_s=0)), True),
    (lambda: ev.WorkloadPreempted(**_msg(reason=ev.PreemptionReason(kind="fair_share"), resumable=True,
                                         progress_s=10, lost_gpu_s=0)), False),
    (lambda: ev.WorkloadRequeued(**_msg(progress_s=10)), False),
    (lambda: ev.WorkloadCheckpointed(**_msg()), False),
], ids=["completed", "failed", "cancelled", "preempted, not resumable: no requeue follows",
        "preempted and requeued: it resumes from its directory", "requeued", "checkpointed under notice"])
def test_which_events_end_a_workload_for_good(event, for_good):
    assert ev.ends_for_good(event()) is for_good


def test_removing_a_checkpoint_directory_takes_its_tree_and_a_missing_one_is_fine(tmp_path):
    d = Path(checkpoint_dir(str(tmp_path), "c", "w"))
    (d / "shard").mkdir(parents=True)
    (d / "shard" / "0.bin").write_bytes(b"x")
    assert remove_checkpoint_dir(str(tmp_path), "c", "w") is True and not d.exists()
    assert remove_checkpoint_dir(str(tmp_path), "c", "w") is False
    assert remove_checkpoint_dir(str(tmp_path / "nothing"), "c", "w") is False


def test_a_symlink_in_place_of_a_checkpoint_directory_is_unlinked_never_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("k")
    root = Path(checkpoints_root(str(tmp_path / "data"), "c"))
    root.mkdir(parents=True)
    (root / "w").symlink_to(outside, target_is_directory=True)
    inner = root / "v"
    inner.mkdir()
    (inner / "escape").symlink_to(outside, target_is_directory=True)  # a link inside a checkpoint
    assert remove_checkpoint_dir(str(tmp_path / "data"), "c", "w") is True
    assert remove_checkpoint_dir(str(tmp_path / "data"), "c", "v") is True
    assert not os.path.lexists(root / "w") and not inner.exists() and (outside / "keep").read_text() == "k"


def test_a_file_in_place_of_a_checkpoint_directory_is_refused_and_left(tmp_path):
    root = Path(checkpoints_root(str(tmp_path), "c"))
    root.mkdir(parents=True)
    (root / "w").write_text("not a directory")
    with pytest.raises(ValueError, match="not a checkpoint directory"):
        remove_checkpoint_dir(str(tmp_path), "c", "w")
    assert (root / "w").exists()
    with pytest.raises(ValueError, match="cannot name a directory"):
        remove_checkpoint_dir(str(tmp_path), "c", "..")


def test_stale_directories_are_those_of_workloads_no_longer_live(tmp_path):
    root = Path(checkpoints_root(str(tmp_path), "c"))
    for name in ("ended", "live", "also-ended"):
        (root / name).mkdir(parents=True)
    (root / "a-file").write_text("f")
    (root / "a-link").symlink_to(tmp_path, target_is_directory=True)
    assert stale_checkpoint_dirs(str(tmp_path), "c", {"live"}) == ["a-link", "also-ended", "ended"]
    assert stale_checkpoint_dirs(str(tmp_path / "none"), "c", set()) == []


def test_started_under_notice_it_saves_what_it_resumed_from_and_exits_at_once(tmp_path):
    (tmp_path / "counter.json").write_text(json.dumps({"step": 7}))
    env = dict(os.environ, TIMESHARE_CHECKPOINT_DIR=str(tmp_path), TIMESHARE_NOTICE_S="60",
               TIMESHARE_UNDER_NOTICE="1", TIMESHARE_ATTEMPT="3", TIMESHARE_RANK="0")
    proc = subprocess.run([sys.executable, str(COUNTER), "--work-s", "40", "--step-s", "5"], env=env, timeout=20)
    assert proc.returncode == 0
    doc = record(tmp_path, 3)
    assert (doc["state"], doc["start_step"], doc["step"]) == ("checkpointed", 7, 7)
    assert json.loads((tmp_path / "counter.json").read_text())["step"] == 7
