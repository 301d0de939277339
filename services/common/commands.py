"""The bodies of commands on ``timeshare.cmd.v1.<cluster>.*``: strict (unknown fields refused),
decoded once by long-lived msgspec decoders. Only the gateway may publish commands (NATS
permissions, services/common/nats_auth.py); a body that does not decode is answered with
``{"error": ..., "status": 400}`` and changes nothing."""

from __future__ import annotations

from typing import TypeVar

import msgspec

T = TypeVar("T")


class CallerBody(msgspec.Struct, forbid_unknown_fields=True):
    """The identity the gateway established from a bearer token (never one a client asserts)."""

    user: str
    manages: list[str] = []
    admin: bool = False
    member_of: list[str] = []


class BudgetSet(msgspec.Struct, forbid_unknown_fields=True):
    caller: CallerBody
    shares: dict[str, float | int]
    reason: str
    request_id: str


class BudgetRemove(msgspec.Struct, forbid_unknown_fields=True):
    caller: CallerBody
    path: str
    reason: str
    request_id: str


class HealthReport(msgspec.Struct, forbid_unknown_fields=True):
    node: str
    ok: bool = True
    reason: str = ""
    needs_human: bool = False
    by: str = ""


class Repaired(msgspec.Struct, forbid_unknown_fields=True):
    node: str
    by: str = ""


class Heartbeat(msgspec.Struct, forbid_unknown_fields=True):
    node: str


DECODERS: dict[type, msgspec.json.Decoder] = {
    t: msgspec.json.Decoder(t) for t in (BudgetSet, BudgetRemove, HealthReport, Repaired, Heartbeat)}


def decode(kind: type[T], data: bytes) -> tuple[T | None, dict | None]:
    """(the body, None), or (None, the reply refusing it)."""
    try:
        return DECODERS[kind].decode(data), None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return None, {"error": f"malformed {kind.__name__} command: {exc}", "status": 400}
