"""The process executor's records of the process groups it started (services/executor/
processes.py), on real processes: what a restarted executor stops, and what it leaves alone."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from services.executor import processes

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="process records read /proc")

IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


def group(code: str = "import time; print('ready', flush=True); time.sleep(60)") -> subprocess.Popen:
    """A process leading a group of its own (as the executor starts each part of a workload)."""
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"ready"  # its handlers are set
    return p


def record(base, p: subprocess.Popen, owner_pid: int, **changes) -> None:
    processes.write(str(base), "c1", p.pid, "w1", 1, 0)
    path = base / "c1" / "processes" / f"{p.pid}.json"
    doc = json.loads(path.read_text())
    doc.update(owner_pid=owner_pid, owner_ticks=processes.start_ticks(owner_pid), **changes)
    path.write_text(json.dumps(doc))


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_group_left_by_a_dead_executor_is_stopped_and_its_record_removed(tmp_path):
    polite, stubborn = group(), group(IGNORE_TERM)
    try:
        for p in (polite, stubborn):
            record(tmp_path, p, dead_pid())
        t0 = time.monotonic()
        stopped = asyncio.run(processes.stop_leftovers(str(tmp_path), "c1", grace_s=0.5))
        assert sorted(r.pid for r in stopped) == sorted([polite.pid, stubborn.pid])
        assert polite.wait(5) == -signal.SIGTERM
        assert stubborn.wait(5) == -signal.SIGKILL  # it ignored SIGTERM: killed after the grace
        assert time.monotonic() - t0 >= 0.5
        assert list((tmp_path / "c1" / "processes").iterdir()) == []
    finally:
        for p in (polite, stubborn):
            if p.poll() is None:
                p.kill()


def test_a_group_whose_executor_still_runs_is_left_to_it(tmp_path):
    owner, work = group(), group()
    try:
        record(tmp_path, work, owner.pid)
        assert asyncio.run(processes.stop_leftovers(str(tmp_path), "c1", grace_s=0.5)) == []
        time.sleep(0.2)
        assert work.poll() is None
        assert (tmp_path / "c1" / "processes" / f"{work.pid}.json").exists()
    finally:
        for p in (owner, work):
            p.kill()
            p.wait()


def test_a_pid_that_now_names_another_process_is_never_signalled(tmp_path):
    other = group()
    try:
        # the record's process started at another time: the pid was reused
        record(tmp_path, other, dead_pid(), start_ticks=processes.start_ticks(other.pid) - 1)
        assert asyncio.run(processes.stop_leftovers(str(tmp_path), "c1", grace_s=0.5)) == []
        time.sleep(0.2)
        assert other.poll() is None
        assert list((tmp_path / "c1" / "processes").iterdir()) == []  # the stale record goes
    finally:
        other.kill()
        other.wait()


def test_a_record_is_kept_while_a_process_of_its_group_outlives_the_leader(tmp_path):
    # the leader starts a child in its group and exits at once
    leader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen([sys.executable, "
                               "'-c', 'import time; time.sleep(60)']); print(p.pid, flush=True)"],
                              start_new_session=True, stdout=subprocess.PIPE)
    child = int(leader.stdout.readline())
    try:
        processes.write(str(tmp_path), "c1", leader.pid, "w1", 1, 0)
        leader.wait(5)
        processes.forget_if_gone(str(tmp_path), "c1", leader.pid)
        assert (tmp_path / "c1" / "processes" / f"{leader.pid}.json").exists()  # the child still runs
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while processes.group_members(leader.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        processes.forget_if_gone(str(tmp_path), "c1", leader.pid)
        assert not (tmp_path / "c1" / "processes" / f"{leader.pid}.json").exists()
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_an_unreadable_record_is_dropped_and_the_others_still_read(tmp_path):
    folder = tmp_path / "c1" / "processes"
    folder.mkdir(parents=True)
    (folder / "1.json").write_text("{not json")
    (folder / "2.json.tmp").write_text("{}")
    (folder / "3.json").write_text(json.dumps({"pid": 3, "start_ticks": 1, "workload_id": "w", "attempt": 1,
                                               "rank": 0}))
    assert [r.pid for r in processes.read_all(str(tmp_path), "c1")] == [3]
    assert sorted(p.name for p in folder.iterdir()) == ["3.json"]
