"""Subject and stream names (the one place they are spelled out; infra/nats.json uses the same).

* the **log**  ``timeshare.v1.<cluster>.<event type>`` (stream TIMESHARE): every accepted event in
  the order placement applied it. Placement is its only writer, so replaying it rebuilds the
  scheduler's state exactly.
* the **inbox** ``timeshare.in.v1.<cluster>.<event type>`` (stream TIMESHARE_IN): events proposed
  by the gateway, executor, health and budget services; placement validates each one, appends
  it to the log (same event id) or dead-letters it with the reason.
* dead letters ``timeshare.dlq.<consumer>`` (stream TIMESHARE_DLQ).
* request/reply (core NATS, not stored): ``timeshare.cmd.v1.<cluster>.<command>`` and
  ``timeshare.query.v1.<cluster>.<query>``; heartbeats ``timeshare.hb.v1.<cluster>``.
"""

from __future__ import annotations

LOG_STREAM = "TIMESHARE"
INBOX_STREAM = "TIMESHARE_IN"
DLQ_STREAM = "TIMESHARE_DLQ"
LEASE_BUCKET = "timeshare_leases"
USAGE_BUCKET = "timeshare_usage"
OPERATOR_BUCKET = "timeshare_operator"  # KV: an operator's decisions (log records placement skips)
SNAPSHOT_BUCKET = "timeshare_snapshots"  # object store: placement's state per cluster, with its log sequence

TICK = "control.tick"  # inbox-only control message of the manual clock (tests, parity runs)


def log_subject(cluster: str, event_type: str) -> str:
    return f"timeshare.v1.{cluster}.{event_type}"


def log_filter(cluster: str) -> str:
    return f"timeshare.v1.{cluster}.>"


def inbox_subject(cluster: str, event_type: str) -> str:
    return f"timeshare.in.v1.{cluster}.{event_type}"


def inbox_filter(cluster: str) -> str:
    return f"timeshare.in.v1.{cluster}.>"


def dlq_subject(consumer: str) -> str:
    return f"timeshare.dlq.{consumer}"


def cmd_subject(cluster: str, command: str) -> str:
    return f"timeshare.cmd.v1.{cluster}.{command}"


def query_subject(cluster: str, query: str) -> str:
    return f"timeshare.query.v1.{cluster}.{query}"


def heartbeat_subject(cluster: str) -> str:
    return f"timeshare.hb.v1.{cluster}"
