"""Each workload's checkpoint directory under the executor's data dir: where it is, and its
removal once the workload has ended for good.

The directory is scratch for resuming (kept across attempts, like Kubernetes' ``emptyDir`` kept
across a container's restarts): a preempted and requeued workload resumes from it, so it stays
while the workload may run again, and goes once nothing of it will (``events.ends_for_good``).
What a workload produces for its users belongs elsewhere. Removal touches only entries directly
under ``<base>/<cluster>/checkpoints``: a symlink there is unlinked (never followed), and
``shutil.rmtree`` does not follow symlinks inside the tree either.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Container


def checkpoints_root(base: str, cluster: str) -> str:
    """The folder holding the cluster's checkpoint directories: ``<base>/<cluster>/checkpoints``."""
    return os.path.join(base, cluster, "checkpoints")


def checkpoint_dir(base: str, cluster: str, workload_id: str) -> str:
    """The workload's checkpoint directory, the same for every attempt: ``<base>/<cluster>/
    checkpoints/<workload id>``. An id that is not one path segment is refused (the gateway's ids
    are; a log written otherwise must not reach outside ``base``)."""
    if not workload_id or workload_id in (".", "..") or "/" in workload_id or "\0" in workload_id:
        raise ValueError(f"workload id {workload_id!r} cannot name a directory")
    return os.path.join(checkpoints_root(base, cluster), workload_id)


def remove_checkpoint_dir(base: str, cluster: str, workload_id: str) -> bool:
    """Remove the workload's checkpoint directory; True when there was one. Missing is fine (it
    never ran a process, or it is gone already). A symlink in its place is unlinked, its target
    left alone; anything that does not resolve to a directory directly inside the checkpoints
    root (a regular file, a path redirected elsewhere) is refused with ``ValueError``."""
    path = checkpoint_dir(base, cluster, workload_id)
    if os.path.islink(path):
        os.unlink(path)
        return True
    if not os.path.lexists(path):
        return False
    root = os.path.realpath(checkpoints_root(base, cluster))
    if not os.path.isdir(path) or os.path.dirname(os.path.realpath(path)) != root:
        raise ValueError(f"{path} is not a checkpoint directory inside {root}: left alone")
    try:
        shutil.rmtree(path)
    except FileNotFoundError:  # removed meanwhile (a sweep and an end at once)
        return False
    return True


def stale_checkpoint_dirs(base: str, cluster: str, live: Container[str]) -> list[str]:
    """The workload ids with a checkpoint directory (or a symlink in its place) that are not in
    ``live`` (the workloads that may still run), sorted; nothing when the root does not exist."""
    try:
        entries = list(os.scandir(checkpoints_root(base, cluster)))
    except FileNotFoundError:
        return []
    return sorted(e.name for e in entries if e.name not in live and (e.is_symlink() or e.is_dir(follow_symlinks=False)))
