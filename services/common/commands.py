"""The bodies of commands on ``timeshare.cmd.v1.<cluster>.*``: strict (unknown fields refused),
decoded once by long-lived msgspec decoders. Only the gateway may publish commands (NATS
permissions, services/common/nats_auth.py); a body that does not decode is answered with
``{"error": ..., "status": 400}`` and changes nothing.

They are the message types of the faststream handlers too (``services/budget/handlers.py``,
``services/health/handlers.py``): the ``Message`` base gives faststream's AsyncAPI generator
their JSON Schema, and the broker converts requests strictly (``broker.StrictMsgSpecSerializer``),
so an unknown field or a value of the wrong type is refused there exactly as by ``decode``."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from .broker import Message

T = TypeVar("T")


class CallerBody(Message, forbid_unknown_fields=True):
    """The identity the gateway established from a bearer token (never one a client asserts)."""

    user: str
    manages: list[str] = []
    admin: bool = False
    member_of: list[str] = []


class BudgetSet(Message, forbid_unknown_fields=True, kw_only=True):
    """Change the shares of tree nodes; ``request_id`` becomes the event id (a retry dedups).
    No shares, or a blank reason, is refused by the budget service (400 naming it)."""
    caller: CallerBody
    shares: dict[str, float | int] = {}
    reason: str = ""
    request_id: str


class BudgetRemove(Message, forbid_unknown_fields=True):
    """Retire ``path`` and its subtree (refused while work is charged below it)."""
    caller: CallerBody
    path: str
    reason: str
    request_id: str


class HealthReport(Message, forbid_unknown_fields=True):
    """A node's health check: ``ok`` false reports it unhealthy (cordon, drain, repair)."""
    node: str
    ok: bool = True
    reason: str = ""
    needs_human: bool = False
    by: str = ""


class Repaired(Message, forbid_unknown_fields=True):
    node: str
    by: str = ""
    #: take back a cordon (a cordoned or drained node) instead of declaring a repair (drained or down)
    uncordon: bool = False


class Heartbeat(Message, forbid_unknown_fields=True):
    node: str


DECODERS: dict[type, msgspec.json.Decoder] = {
    t: msgspec.json.Decoder(t) for t in (BudgetSet, BudgetRemove, HealthReport, Repaired, Heartbeat)}


def decode(kind: type[T], data: bytes) -> tuple[T | None, dict | None]:
    """(the body, None), or (None, the reply refusing it)."""
    try:
        return DECODERS[kind].decode(data), None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return None, {"error": f"malformed {kind.__name__} command: {exc}", "status": 400}
