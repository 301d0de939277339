"""Write the gateway's OpenAPI and the services' AsyncAPI documents into ``schemas/``.

    PYTHONPATH=shared:. python -m services.schemas schemas

The AsyncAPI document is built from the same subject functions and event types the services
use (services/common/subjects.py, timeshare.events), so it cannot drift from the code;
tests/integration/test_schemas.py fails when the files in schemas/ are stale.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import msgspec

from timeshare import events as ev

from .common import subjects

PROPOSED = ("workload.submitted", "workload.completed", "workload.failed", "workload.cancelled", "node.unhealthy",
            "node.failed", "node.repaired", "budget.changed")
PUBLISHERS = {
    "workload.submitted": "gateway", "workload.cancelled": "gateway", "workload.completed": "executor",
    "workload.failed": "executor", "node.unhealthy": "health", "node.failed": "health",
    "node.repaired": "health", "budget.changed": "budget",
}
LOG_READERS = "gateway (workloads, history), ledger (usage, report), budget (tree, audit), health (node states), executor (what to run)"


def openapi() -> dict:
    from .gateway.app import create_app

    return create_app(types.SimpleNamespace(cluster="{cluster}")).openapi()


def asyncapi() -> dict:
    _, components = msgspec.json.schema_components([ev.Event], ref_template="#/components/schemas/{name}")
    channels, operations, messages = {}, {}, {}
    for t in ev.EVENT_TYPES:
        tag = t.__struct_config__.tag
        name = t.__name__
        messages[name] = {"name": tag, "title": name, "payload": {"$ref": f"#/components/schemas/{name}"},
                          "headers": {"type": "object", "properties": {
                              "Nats-Msg-Id": {"type": "string", "description": "<cluster>/<event_id> (JetStream dedup)"},
                              "Timeshare-Event-Type": {"type": "string", "const": tag},
                              "traceparent": {"type": "string", "description": "W3C trace context"}}}}
        key = "log." + tag
        channels[key] = {"address": subjects.log_subject("{cluster}", tag), "parameters": {"cluster": {}},
                         "description": f"stream {subjects.LOG_STREAM}: accepted {tag} events, written by placement "
                                        f"only; read by {LOG_READERS}",
                         "messages": {name: {"$ref": f"#/components/messages/{name}"}}}
        operations[f"append.{tag}"] = {"action": "send", "channel": {"$ref": f"#/channels/{key}"},
                                       "summary": "placement appends (fenced, in apply order)"}
        if tag in PROPOSED:
            ikey = "inbox." + tag
            channels[ikey] = {"address": subjects.inbox_subject("{cluster}", tag), "parameters": {"cluster": {}},
                              "description": f"stream {subjects.INBOX_STREAM}: {tag} proposed by "
                                             f"{PUBLISHERS[tag]}; placement validates, appends or dead-letters",
                              "messages": {name: {"$ref": f"#/components/messages/{name}"}}}
            operations[f"propose.{tag}"] = {"action": "send", "channel": {"$ref": f"#/channels/{ikey}"},
                                            "summary": f"{PUBLISHERS[tag]} proposes"}
            operations[f"validate.{tag}"] = {"action": "receive", "channel": {"$ref": f"#/channels/{ikey}"},
                                             "summary": "placement (durable consumer placement-<cluster>)"}
    channels["dlq"] = {"address": subjects.dlq_subject("{consumer}"), "parameters": {"consumer": {}},
                       "description": f"stream {subjects.DLQ_STREAM}: the original message, headers "
                                      "Timeshare-Reason, Timeshare-Subject, Timeshare-Stream-Seq"}
    for cmd, desc in (("budget.set", "budget: change shares (reply: changed + fractions, or error + status)"),
                      ("health.report", "health: a node's health check result"),
                      ("health.repaired", "health: a human declares a node repaired"),
                      ("executor.advance", "executor (manual clock): {now_ms, log_seq}: apply the log up to log_seq, then end simulated "
                                           "work due by now_ms (reply: completed ids)")):
        channels["cmd." + cmd] = {"address": subjects.cmd_subject("{cluster}", cmd), "parameters": {"cluster": {}},
                                  "description": "request/reply, core NATS (not stored). " + desc}
    for q, desc in (("queue", "placement: pending work in scheduling order with ordering keys"),
                    ("tree", "placement: tree with fractions, usage and ratios"),
                    ("nodes", "placement: nodes, states, free GPUs"), ("digest", "placement: state fingerprint"),
                    ("workload", "placement: one workload's scheduler state"),
                    ("budget.history", "budget: audit log"), ("ledger.report", "ledger: owed/delivered/attainment"),
                    ("ledger.usage", "ledger: rolling-window usage"), ("health.nodes", "health: heartbeats")):
        channels["query." + q] = {"address": subjects.query_subject("{cluster}", q), "parameters": {"cluster": {}},
                                  "description": "request/reply, core NATS. " + desc}
    channels["heartbeat"] = {"address": subjects.heartbeat_subject("{cluster}"), "parameters": {"cluster": {}},
                             "description": "core NATS: {\"node\": name} from node agents, read by health"}
    channels["control.tick"] = {"address": subjects.inbox_subject("{cluster}", subjects.TICK),
                                "parameters": {"cluster": {}},
                                "description": "manual clock only: {\"at_ms\"}; placement runs one pass at that time "
                                               "and replies to the Timeshare-Reply header subject (pending, running, "
                                               "next_protection_expiry_ms, log_seq)"}
    return {"asyncapi": "3.0.0",
            "info": {"title": "timeshare services", "version": "1.0.0",
                     "description": "Event-sourced GPU scheduler: the inbox/log/dead-letter streams and the "
                                    "request/reply subjects of every service."},
            "defaultContentType": "application/json",
            "servers": {"local": {"host": "127.0.0.1:4222", "protocol": "nats"}},
            "channels": channels, "operations": operations,
            "components": {"messages": messages, "schemas": components}}


def documents() -> dict[str, str]:
    return {"openapi.json": json.dumps(openapi(), indent=2, sort_keys=True) + "\n",
            "asyncapi.json": json.dumps(asyncapi(), indent=2, sort_keys=True) + "\n"}


def main(argv: list[str] | None = None) -> int:
    out = Path((argv or sys.argv[1:] or ["schemas"])[0])
    out.mkdir(parents=True, exist_ok=True)
    for name, text in documents().items():
        (out / name).write_text(text)
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
