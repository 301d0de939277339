"""Who may publish and subscribe to what on NATS: one user per service, checked by nats-server.

Without this, anyone who reaches NATS could put a ``budget.set`` command with a self-declared
admin caller, a forged ``budget.changed`` or completion on the inbox, or a forged start on the
log. With it, the server itself refuses the publish (a "Permissions Violation"):

* **placement** is the only user that may publish to the log (``timeshare.v1.>``), the lease
  bucket and the snapshot object store (the snapshot is a pickle placement loads);
* each other service may propose only the events it owns (gateway: submitted / cancelled,
  executor: completed / failed, health: node.unhealthy / failed / repaired, budget:
  budget.changed), and the **gateway** alone may send commands (``timeshare.cmd.v1.>``), so the
  ``caller`` of a command is the identity the gateway established from a bearer token;
* each service subscribes only to the commands and queries it answers (a service cannot
  answer in another's name) and to its own ``_INBOX`` replies and JetStream deliveries. The
  handlers are faststream subscribers (``services/<name>/handlers.py``) on a broker that logs in
  as the same user (``broker.make_broker``): a subject added to a router must be added here
  (``tests/unit/test_security_rules.py`` checks every router against this table);
* placement alone purges the log (``$JS.API.STREAM.PURGE.TIMESHARE``, below its snapshots);
  the executor, which starts from placement's snapshot, only reads the snapshot store;
* **operator** may do everything: the devstack driver (manual clock ticks), tests, the
  operator's tools (``nats`` CLI, ``python -m services.placement.skip``). Keep its password
  off service hosts.

Streams, durable consumers, KV buckets and the object store are the operator's: one step
(``python -m services.admin setup``, from infra/nats.json) creates them; services only bind
(``Bus.ensure_infra`` checks and waits). No service may create, update or delete a stream; a
service creates and deletes only pull consumers on the streams it reads, with filters inside
its own subjects (``_consumers`` below; what that still allows is in docs/design/security.md).
Purging is placement's (its log, below its snapshots).

``python -m services.common.nats_auth DIR`` writes ``DIR/nats-auth.conf`` (include it from the
server's configuration) and ``DIR/nats-credentials.json`` (``TIMESHARE_NATS_CREDENTIALS``), both
0600, with fresh random passwords.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path

SERVICES = ("placement", "gateway", "budget", "ledger", "health", "executor")
OPERATOR = "operator"
ROLES = (*SERVICES, OPERATOR)

# JetStream use every service needs, read-only: stream/consumer info, direct gets (KV reads),
# acks and the dead-letter stream. No service creates, updates or deletes a stream, KV bucket or
# object store: the operator's setup step does (services/admin, from infra/nats.json). Issue 22,
# finding 1: with $JS.API.STREAM.CREATE any service's password made a stream on the query and
# command subjects, and JetStream answered every query and command first.
_JS_READ = ["$JS.API.INFO", "$JS.API.STREAM.INFO.>", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
            "$JS.API.STREAM.MSG.GET.>", "$JS.API.DIRECT.GET.>", "$JS.API.CONSUMER.INFO.>", "$JS.ACK.>",
            "timeshare.dlq.>"]


def _consumers(stream: str, filter_subject: str) -> list[str]:
    """Pull consumers on ``stream`` whose filter is within ``filter_subject``: create one (the
    filtered form ``CONSUMER.CREATE.<stream>.<name>.<filter>``, so the server refuses another
    filter; an ephemeral replay or a durable moved back to the store's sequence), pull from
    it, delete one (a durable re-created at another start). NATS subjects cannot say "names that
    start with ledger-": a reader of a stream can delete another reader's durable there; its
    owner creates it again at the sequence its store recorded (nothing lost; see
    docs/design/security.md)."""
    return [f"$JS.API.CONSUMER.CREATE.{stream}.*.{filter_subject}", f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*",
            f"$JS.API.CONSUMER.DELETE.{stream}.*"]


_LOG_ALL = _consumers("TIMESHARE", "timeshare.v1.>")
# the snapshot store is read through an ordered consumer on its stream
_SNAPSHOT_READ = [*_consumers("OBJ_timeshare_snapshots", "$O.timeshare_snapshots.>"),
                  "$JS.API.CONSUMER.CREATE.OBJ_timeshare_snapshots", "$JS.FC.>"]
_Q = "timeshare.query.v1.*"
_C = "timeshare.cmd.v1.*"
_IN = "timeshare.in.v1.*"


def _healthz(service: str) -> str:
    return f"{_Q}.healthz.{service}"


PERMISSIONS: dict[str, dict[str, list[str]]] = {
    "placement": {
        "publish": [*_JS_READ, *_consumers("TIMESHARE_IN", "timeshare.in.v1.>"), *_LOG_ALL, *_SNAPSHOT_READ,
                    "timeshare.v1.>", "$KV.timeshare_leases.>", "$O.timeshare_snapshots.>",
                    "$JS.API.STREAM.PURGE.OBJ_timeshare_snapshots",
                    # the bounded log: after a snapshot placement purges its cluster's log below
                    # it (the purge mark goes first into the snapshot store, above)
                    "$JS.API.STREAM.PURGE.TIMESHARE",
                    # the manual clock's tick names its reply subject in a header (an _INBOX)
                    "_INBOX.>"],
        "subscribe": ["_INBOX.>", _healthz("placement"),
                      *(f"{_Q}.{q}" for q in ("queue", "tree", "nodes", "workload", "explain", "digest", "work")),
                      # its spans of a workload, gathered by the gateway from every process
                      f"{_Q}.trace"],
    },
    "gateway": {
        "publish": [*_JS_READ, *_LOG_ALL, f"{_IN}.workload.submitted", f"{_IN}.workload.cancelled", f"{_C}.>", f"{_Q}.>",
                    "timeshare.hb.v1.*"],
        "subscribe": ["_INBOX.>"],
    },
    "budget": {
        "publish": [*_JS_READ, *_consumers("TIMESHARE", "timeshare.v1.*.budget.>"), f"{_IN}.budget.changed", f"{_Q}.work"],
        "subscribe": ["_INBOX.>", _healthz("budget"), f"{_C}.budget.set", f"{_C}.budget.remove",
                      f"{_Q}.budget.history",
                      # placement's refusals of proposed changes, with the reason (Budget._on_dead_letter;
                      # a subject token is matched whole: "placement-*" would match nothing)
                      "timeshare.dlq.*"],
    },
    "ledger": {
        "publish": [*_JS_READ, *_LOG_ALL, "$KV.timeshare_usage.>"],
        "subscribe": ["_INBOX.>", _healthz("ledger"), f"{_Q}.ledger.report", f"{_Q}.ledger.series",
                      f"{_Q}.ledger.usage"],
    },
    "health": {
        "publish": [*_JS_READ, *_consumers("TIMESHARE", "timeshare.v1.*.node.>"), f"{_IN}.node.unhealthy", f"{_IN}.node.failed", f"{_IN}.node.repaired"],
        "subscribe": ["_INBOX.>", _healthz("health"), "timeshare.hb.v1.*", f"{_C}.health.report",
                      f"{_C}.health.repaired", f"{_Q}.health.nodes"],
    },
    "executor": {
        "publish": [*_JS_READ, *_LOG_ALL, *_SNAPSHOT_READ, f"{_IN}.workload.completed", f"{_IN}.workload.failed",
                    f"{_IN}.workload.checkpointed"],
        "subscribe": ["_INBOX.>", _healthz("executor"), f"{_C}.executor.advance", f"{_Q}.trace"],
    },
    OPERATOR: {"publish": [">"], "subscribe": [">"]},
}


def role_of(name: str) -> str:
    """The NATS user of a connection named ``name`` ("placement-1a2b" -> placement; tests and
    tools -> operator)."""
    head = name.split("-", 1)[0]
    return head if head in SERVICES else OPERATOR


def new_credentials() -> dict[str, str]:
    return {role: secrets.token_urlsafe(24) for role in ROLES}


def server_config(credentials: dict[str, str]) -> str:
    """An ``authorization { users = [...] }`` block for nats-server (JSON is valid NATS config)."""
    users = []
    for role in ROLES:
        perms = PERMISSIONS[role]
        users.append({"user": role, "password": credentials[role],
                      "permissions": {"publish": {"allow": perms["publish"]},
                                      "subscribe": {"allow": perms["subscribe"]},
                                      # answering a request publishes to the asker's reply subject
                                      "allow_responses": True}})
    return "authorization " + json.dumps({"users": users}, indent=1) + "\n"


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def write_files(directory: str, credentials: dict[str, str] | None = None) -> tuple[str, str]:
    """``nats-auth.conf`` and ``nats-credentials.json`` in ``directory`` (kept when they exist,
    so a restarted server and the services that know the passwords agree); returns both paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    creds_path, conf_path = d / "nats-credentials.json", d / "nats-auth.conf"
    if credentials is None:
        try:
            credentials = json.loads(creds_path.read_text())
        except (OSError, ValueError):
            credentials = new_credentials()
    _write_private(creds_path, json.dumps(credentials, indent=1))
    _write_private(conf_path, server_config(credentials))
    return str(conf_path), str(creds_path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m services.common.nats_auth DIR   (writes DIR/nats-auth.conf and "
              "DIR/nats-credentials.json, 0600)", file=sys.stderr)
        return 2
    conf, creds = write_files(args[0])
    print(f"wrote {conf} (nats-server: include it) and {creds} (TIMESHARE_NATS_CREDENTIALS)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
