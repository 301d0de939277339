"""Placement's snapshots in the ``timeshare_snapshots`` object store: their names, and where a
reader of the log starts (a new placement leader; the executor, which runs what the snapshot
says is running and follows the log after it). Placement writes them (``placement/log.py``).
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

from nats.js.errors import ObjectNotFoundError

from . import subjects
from .code_version import code_version

log = logging.getLogger("timeshare.placement")

#: snapshots are loaded by the same code only: the core, placement's service (which writes them;
#: the modules it is composed of) and this file
_PLACEMENT = Path(__file__).resolve().parents[1] / "placement"
CODE_VERSION = code_version(*(_PLACEMENT / f"{m}.py" for m in ("service", "leader", "log", "inbox", "tracing")),
                            __file__)


def snapshot_name(cluster: str) -> str:
    return f"placement.{cluster}"


def purge_mark_name(cluster: str) -> str:
    """The object holding the sequence below which the cluster's log was purged (written first)."""
    return f"placement.{cluster}.purged"


async def read_snapshot(bus, cluster: str, use: bool = True) -> dict | None:
    """Placement's latest snapshot of ``cluster`` if a reader should start from it, else None
    (read the whole log). ``use=False`` (snapshots off) still reads it once the log is purged.

    The log not purged: a snapshot from other code (CODE_VERSION), unreadable or missing
    costs a full replay and nothing else. The log purged (the mark exists): the snapshot is
    the only start there is; from other code it is used anyway (unpickled into this code's
    classes), unreadable or missing it is an error (a full replay would build a wrong state)."""
    store = await bus.object_store(subjects.SNAPSHOT_BUCKET)
    try:
        purged = int((await store.get(purge_mark_name(cluster))).data)
    except ObjectNotFoundError:
        purged = 0
    if not use and not purged:
        return None
    try:
        obj = await store.get(snapshot_name(cluster))
    except ObjectNotFoundError:
        if purged:
            raise RuntimeError(f"the log of {cluster} is purged below seq {purged} and its snapshot "
                               "is gone: cannot rebuild") from None
        return None
    try:
        snap = pickle.loads(obj.data)
    except Exception as exc:  # noqa: BLE001
        if purged:
            raise RuntimeError(f"snapshot of {cluster} unreadable ({exc}) and the log is purged below "
                               f"seq {purged}: cannot rebuild") from exc
        log.warning("snapshot of %s unreadable (%s): replaying the whole log", cluster, exc)
        return None
    if snap.get("cluster") != cluster:
        log.info("snapshot of %s is of another cluster: replaying the whole log", cluster)
        return None
    if snap.get("code") != CODE_VERSION:
        if purged:
            log.warning("snapshot of %s is from other code, but the log is purged below seq %d: "
                        "starting from it", cluster, purged)
            return snap
        log.info("snapshot of %s is from other code: replaying the whole log", cluster)
        return None
    return snap
