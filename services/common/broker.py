"""faststream wiring for the services' request/reply handlers (commands, queries, healthz).

Each service declares its handlers on a ``NatsRouter`` in its own ``handlers.py`` (msgspec
message types, one subscriber per subject); its ``main.py`` (the composition root) builds the
broker with ``make_broker`` and hands it to the service, which starts it once its state is
loaded (a query answered before that would show an empty state).

What stays on nats-py (``bus.py``), and why: the JetStream pull consumers that must ack only
after a PostgreSQL commit and rewind a durable to a stored sequence (the projector runner,
placement's inbox), the fenced appends (``Nats-Expected-Last-Subject-Sequence`` on the first
message of a batch, confirmed before the rest leaves), KV leases with compare-and-set
revisions, the snapshot object store, the log replay, and the requests the gateway and the
drivers *send*. faststream's pull subscriber acks per message after the handler, with no hook
to rewind a durable or to fence an append; its ``message_id`` is not ``Nats-Msg-Id``.

Every broker decodes with msgspec (``MsgSpecSerializer``): a request that does not match its
message type is answered ``{"error": ..., "status": 400}`` naming the field (not left
unanswered, which the caller would see as a timeout).
"""

from __future__ import annotations

import inspect
import logging
import re
from typing import Any

import msgspec

from fast_depends.exceptions import ValidationError
from fast_depends.msgspec import MsgSpecSerializer
from fast_depends.msgspec.serializer import _MsgSpecWrappedSerializer, _MsgSpecWrappedSerializerWithResponse
from faststream import Response
from faststream.middlewares import ExceptionMiddleware
from faststream.nats import NatsBroker, NatsRouter
from faststream.nats.security import NatsSecurity, NatsUserPassword

from .settings import Settings

log = logging.getLogger("timeshare.handlers")

__all__ = ["Message", "NatsRouter", "TraceQuery", "make_broker", "malformed_request"]


def _describe(exc: ValidationError) -> str:
    original = getattr(exc, "original_error", None)
    text = str(original) if original is not None else str(exc)
    # msgspec says "Object missing required field `node`" / "Expected `int`, got `str` - at `$.limit`"
    text = re.sub(r"\s+", " ", text).strip()
    return text[:500]


class _StrictWrapped(_MsgSpecWrappedSerializer):
    """fast_depends' msgspec serializer converts *laxly* (``"false"`` becomes ``False``, ``"3"``
    becomes 3); a command body is decoded strictly (as ``msgspec.json.decode`` does), and a
    message type's ``forbid_unknown_fields`` (services/common/commands.py) holds as well."""

    def __call__(self, call_kwargs: dict[str, Any]) -> dict[str, Any]:
        with self._try_msgspec(call_kwargs, self.options):
            casted = msgspec.convert(call_kwargs, type=self.model, strict=True, str_keys=True,
                                     dec_hook=self.dec_hook)
        return {field: getattr(casted, field, None) for field in self.aliases}


class _StrictWrappedWithResponse(_StrictWrapped, _MsgSpecWrappedSerializerWithResponse):
    def response(self, value: Any) -> Any:
        # a reply already encoded (payload.answer: plain or compressed JSON with its headers)
        # goes out as it is; the handler's annotation still documents its body's type
        if isinstance(value, Response):
            return value
        return super().response(value)


class StrictMsgSpecSerializer(MsgSpecSerializer):
    """``MsgSpecSerializer`` with strict conversion of the request (the reply is unchanged)."""

    def __call__(self, *, name: str, options: list, response_type: Any):
        if response_type is not inspect.Parameter.empty:
            return _StrictWrappedWithResponse(name=name, options=options, response_type=response_type,
                                              dec_hook=self.dec_hook)
        return _StrictWrapped(name=name, options=options, dec_hook=self.dec_hook)


malformed_request = ExceptionMiddleware()


@malformed_request.add_handler(ValidationError, publish=True)
async def _refuse(exc: ValidationError) -> dict:
    return {"error": f"malformed request: {_describe(exc)}", "status": 400}


def _security(settings: Settings, name: str) -> NatsSecurity | None:
    """The same NATS user, password and TLS as the service's ``Bus.connect`` (``connect_auth``):
    with NATS auth on, a broker without them is refused ("Authorization Violation"), and its
    subscriptions must fit that user's permissions (services/common/nats_auth.py)."""
    from .bus import connect_auth

    auth = connect_auth(settings, name)
    if "user" in auth:
        return NatsUserPassword(auth["user"], auth["password"], ssl_context=auth.get("tls"))
    if auth.get("tls") is not None:
        return NatsSecurity(ssl_context=auth["tls"])
    return None


def make_broker(settings: Settings, name: str, *routers: NatsRouter) -> NatsBroker:
    """A broker of its own NATS connection for ``name``'s handlers (reconnects for ever, like the
    service's JetStream connection; core subscriptions are re-made by nats-py on reconnect),
    authenticated as ``name``'s NATS user (``placement-<instance>`` -> placement). When the
    process traces (``TIMESHARE_OTEL``, set up here for services that make no spans of their
    own), faststream's telemetry middleware puts each handled request in the trace its
    ``traceparent`` header names."""
    from . import telemetry

    telemetry.setup_telemetry(name.split("-")[0], settings.otel)
    broker = NatsBroker(
        settings.nats_url.split(","), name=f"{name}-handlers", serializer=StrictMsgSpecSerializer(),
        security=_security(settings, name),
        max_reconnect_attempts=-1, reconnect_time_wait=0.5,
        # telemetry outermost: its span covers the refusal of a malformed request too
        middlewares=[*telemetry.broker_middlewares(), malformed_request],
        # one line per handled message at DEBUG (a query per HTTP request would flood INFO);
        # a handler that raises is still logged at ERROR with its traceback
        logger=logging.getLogger(f"timeshare.{name}.handlers"), log_level=logging.DEBUG,
        graceful_timeout=5.0)
    for r in routers:
        broker.include_router(r)
    return broker


def _inline(schema, defs: dict):
    """``schema`` with every ``#/$defs/...`` reference replaced by its definition."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.rsplit("/", 1)[-1]], defs)
        return {k: _inline(v, defs) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_inline(v, defs) for v in schema]
    return schema


class Message(msgspec.Struct):
    """A request or command on a faststream handler. msgspec decodes it (``MsgSpecSerializer``);
    faststream's AsyncAPI generator asks pydantic for a schema, so the two hooks below hand
    pydantic msgspec's own JSON Schema of the struct (validation stays msgspec's)."""

    @classmethod
    def __get_pydantic_core_schema__(cls, _source, _handler):
        from pydantic_core import core_schema

        return core_schema.any_schema()

    @classmethod
    def __get_pydantic_json_schema__(cls, _core_schema, _handler):
        schema = msgspec.json.schema(cls)
        return _inline(schema, schema.pop("$defs", {}))


class TraceQuery(Message, kw_only=True):
    """``trace`` (every process that keeps spans answers; the gateway gathers the answers,
    services.common.telemetry.gather_trace): a workload's spans, of ``trace_id`` when the asker
    knows the trace already."""
    workload_id: str | None = None
    trace_id: str | None = None
