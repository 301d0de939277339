"""The process executor's record of the process groups it started, so that none outlives it
unsupervised.

Two mechanisms, because an executor killed with -9 runs no code of its own afterwards:

* **parent-death signal** (Linux ``prctl(PR_SET_PDEATHSIG, SIGTERM)``, set in the child before
  it runs the command): when the executor dies, each process it started gets SIGTERM, as on the
  executor's own stop. A workload that checkpoints on SIGTERM writes its checkpoint and exits;
  the restarted executor starts it again and it resumes from that checkpoint. It reaches only
  the processes the executor started itself, not what they start in turn.
* **records** (one file per process group under ``<data dir>/<cluster>/processes/``, written
  when a process starts, removed when it has exited): an executor starting stops every group a
  previous instance left (SIGTERM to the group, ``kill_grace_s``, then SIGKILL) before it
  starts anything, so a restart never runs a workload a second time next to its old processes
  or puts two processes on one GPU. A group whose executor still runs (another instance on the
  same data dir) is left to it. A group whose leader's pid now belongs to another process
  (its start time differs) is left alone: while any member of the old group lives its pid
  cannot be reused, so the group is gone.

An executor cannot adopt such processes instead: it can wait only for its own children, so it
would never learn their exit codes (completed, failed, checkpointed).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
import logging
import os
import signal
import time
from dataclasses import dataclass

log = logging.getLogger("timeshare.executor")

_PR_SET_PDEATHSIG = 1


def _libc_prctl():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):  # not Linux: the records alone
        return None


#: resolved once in the executor, before any fork: the child only calls it
_PRCTL = _libc_prctl()


def die_with_parent(parent_pid: int):
    """A ``preexec_fn`` for ``create_subprocess_exec``: the child gets SIGTERM when the executor
    (``parent_pid``) dies; if it died already between fork and exec, the child ends itself."""
    prctl = _PRCTL

    def preexec() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def records_dir(base: str, cluster: str) -> str:
    return os.path.join(base, cluster, "processes")


def _stat_fields(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` from field 3 on (state, ppid, pgrp, ...); None when no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: split after its end
    return stat[stat.rindex(b")") + 2:].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22): with the pid, it names one
    process; None when no such process is (or no ``/proc``)."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def group_members(pgid: int) -> list[int] | None:
    """The live (not zombie) processes of a process group, from ``/proc``; None without it. A
    zombie still counts for ``kill(pid, 0)``, and orphans are reaped by whatever adopted them
    (an init that may be slow, or none in a bare container): what is left of them holds no GPU."""
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return None
    out = []
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None and fields[0] != b"Z" and int(fields[2]) == pgid:
            out.append(pid)
    return out


@dataclass(frozen=True)
class Record:
    pid: int  # the group's leader: the group id is its pid (start_new_session)
    start_ticks: int | None
    workload_id: str
    attempt: int
    rank: int
    #: the executor that started it (pid, start ticks): a group whose executor still runs is
    #: that executor's to stop (two instances on one data dir during a rolling restart)
    owner_pid: int = 0
    owner_ticks: int | None = None


def write(base: str, cluster: str, pid: int, workload_id: str, attempt: int, rank: int) -> None:
    """Record a process group the executor started (written whole: a temporary file renamed)."""
    folder = records_dir(base, cluster)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{pid}.json")
    me = os.getpid()
    doc = {"pid": pid, "start_ticks": start_ticks(pid), "workload_id": workload_id, "attempt": attempt,
           "rank": rank, "owner_pid": me, "owner_ticks": start_ticks(me)}
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)


def forget_if_gone(base: str, cluster: str, pid: int) -> None:
    """The group's leader exited and was reaped: its record goes, unless processes it started
    still run in its group (then the next executor's start stops them)."""
    if group_members(pid):
        return
    forget(base, cluster, pid)


def forget(base: str, cluster: str, pid: int) -> None:
    _unlink(os.path.join(records_dir(base, cluster), f"{pid}.json"))


def read_all(base: str, cluster: str) -> list[Record]:
    """Every record left in the folder (an unreadable one is dropped with a warning)."""
    folder = records_dir(base, cluster)
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    except OSError as exc:  # unreadable: nothing can be stopped, which must not stop the executor
        log.warning("executor: cannot read the process records in %s (%s): none stopped", folder, exc)
        return []
    out = []
    for name in names:
        path = os.path.join(folder, name)
        if not name.endswith(".json"):
            if name.endswith(".tmp"):
                _unlink(path)  # a write cut short: its process is recorded by no one
            continue
        try:
            with open(path) as f:
                d = json.load(f)
            out.append(Record(int(d["pid"]), d["start_ticks"], str(d["workload_id"]), int(d["attempt"]),
                              int(d["rank"]), int(d.get("owner_pid", 0)), d.get("owner_ticks")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("executor: unreadable process record %s (%s): dropped", path, exc)
            _unlink(path)
    return out


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def owner_alive(rec: Record) -> bool:
    """Whether the executor that started the group still runs (and is not this one)."""
    if rec.owner_pid in (0, os.getpid()):
        return False
    ticks = start_ticks(rec.owner_pid)
    return ticks is not None and ticks == rec.owner_ticks


def group_alive(rec: Record) -> bool:
    """Whether any process of the recorded group still lives (and the pid is still its)."""
    ticks = start_ticks(rec.pid)
    if ticks is not None and rec.start_ticks is not None and ticks != rec.start_ticks:
        return False  # the pid is another process's now: the old group is gone (module docstring)
    members = group_members(rec.pid)
    if members is not None:
        return bool(members)
    try:
        os.killpg(rec.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a group of someone else's: not ours to stop
        return False
    return True


def _signal_group(rec: Record, sig: int) -> None:
    try:
        os.killpg(rec.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def stop_leftovers(base: str, cluster: str, grace_s: float, poll_s: float = 0.05) -> list[Record]:
    """Stop every process group a previous executor left running (SIGTERM, up to ``grace_s``,
    then SIGKILL) and remove the records; returns the records of the groups it stopped."""
    records = read_all(base, cluster)
    owned = [r for r in records if owner_alive(r)]
    for rec in owned:
        log.warning("executor %s: process group %d of %s belongs to another executor still running (pid %d) on "
                    "this data dir: left to it", cluster, rec.pid, rec.workload_id, rec.owner_pid)
    alive = [r for r in records if r not in owned and group_alive(r)]
    for rec in alive:
        log.warning("executor %s: process group %d of %s (attempt %d, rank %d) outlived the previous executor: "
                    "stopping it before starting anything", cluster, rec.pid, rec.workload_id, rec.attempt, rec.rank)
        _signal_group(rec, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    left = list(alive)
    while left and time.monotonic() < deadline:
        await asyncio.sleep(poll_s)
        left = [r for r in left if group_alive(r)]
    for rec in left:
        _signal_group(rec, signal.SIGKILL)
    # SIGKILL cannot be ignored: gone within moments, unless a process is held in the kernel
    # (uninterruptible I/O)
    deadline = time.monotonic() + max(grace_s, 5.0)
    while left and time.monotonic() < deadline:
        await asyncio.sleep(poll_s)
        left = [r for r in left if group_alive(r)]
    for rec in left:
        log.error("executor %s: process group %d of %s still runs after SIGKILL (uninterruptible I/O?): its GPUs "
                  "may still be in use", cluster, rec.pid, rec.workload_id)
    for rec in records:
        if rec not in owned:
            forget(base, cluster, rec.pid)
    return alive
