"""Deterministic event ids for events proposed by the shell (so a retry dedups by Nats-Msg-Id)."""

from __future__ import annotations

import hashlib
import uuid


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:20]}"


def workload_id_for_key(user: str, idempotency_key: str) -> str:
    """The same (user, Idempotency-Key) always names the same workload."""
    return "w-" + hashlib.sha256(f"{user}\0{idempotency_key}".encode()).hexdigest()[:20]


def submitted_id(workload_id: str) -> str:
    return f"sub.{workload_id}"


def ended_id(kind: str, workload_id: str, attempt: int) -> str:
    """completed/failed reported by an executor for one attempt: ``done.<id>.<attempt>``."""
    return f"{kind}.{workload_id}.{attempt}"


def attempt_of(event_id: str) -> int | None:
    """The attempt an executor report is about (None when the id does not say)."""
    head, _, tail = event_id.rpartition(".")
    return int(tail) if head and tail.isdigit() else None
