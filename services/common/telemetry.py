"""OpenTelemetry: a tracer per service, trace context carried in NATS headers (W3C traceparent).

``TIMESHARE_OTEL``:
* ``none`` (the default): spans are created by the API's no-op tracer and cost almost nothing;
  when the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is
  set, it means ``otlp`` (a deployment that configured a collector wants its traces);
* ``memory``: the latest spans are kept in this process (``SpanStore``) where the gateway's
  ``/v1/workloads/{id}/trace`` and the dashboard's workload page read them: tracing on a laptop
  without a collector (the devstack's default; it runs every service in one process);
* ``console``: printed; ``otlp``: exported with the OTLP/HTTP exporter, configured by the
  standard ``OTEL_EXPORTER_OTLP_*`` variables (endpoint, headers, timeout), plus the memory store.

``OTEL_SDK_DISABLED=true`` turns everything off. The tracer provider is one per process (the
OpenTelemetry API allows it to be set once), so the first service that asks for tracing sets
it; each service has its own tracer (instrumentation scope ``timeshare.<service>``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict, deque
from typing import Any

from opentelemetry import propagate, trace

log = logging.getLogger("timeshare.telemetry")

_configured = False
_store: "SpanStore | None" = None

#: spans the memory store keeps (about 1-2 kB each): the latest few thousand workloads' traces
MEMORY_SPANS = 50_000


def _otlp_env_set() -> bool:
    # the standard OpenTelemetry variables, read by its SDK; we only look whether one is set
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def setup_telemetry(service: str, mode: str) -> trace.Tracer:
    """The tracer of ``service``; the first call with a mode other than ``none`` sets the
    process's tracer provider."""
    global _configured, _store
    if mode == "none" and _otlp_env_set():
        mode = "otlp"
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        mode = "none"
    if mode != "none" and not _configured:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win when set (Resource.create reads them)
        name = os.environ.get("OTEL_SERVICE_NAME") or "timeshare"
        provider = TracerProvider(resource=Resource.create({"service.name": name}), sampler=_quiet_roots())
        if mode == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif mode == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                log.warning("TIMESHARE_OTEL=otlp needs opentelemetry-exporter-otlp-proto-http; OTLP export off")
            else:
                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        if mode in ("memory", "otlp"):
            _store = SpanStore(MEMORY_SPANS)
            provider.add_span_processor(_store)
        elif mode != "console":
            log.warning("TIMESHARE_OTEL=%r: expected none, memory, console or otlp; keeping spans in memory", mode)
            _store = SpanStore(MEMORY_SPANS)
            provider.add_span_processor(_store)
        trace.set_tracer_provider(provider)
        _configured = True
    return trace.get_tracer(f"timeshare.{service}")


def _quiet_roots():
    """Every span, except a PostgreSQL query's or a bus message's that starts a trace of its own
    (no parent): the projections' commits and the heartbeats, several a second, would each be a
    one-span trace crowding the workloads' spans out of the span store and the collector. Inside
    a trace (an HTTP request's, a workload's message's, a request carrying ``traceparent``)
    they are kept."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, ParentBased, Sampler, SamplingResult

    class QuietRoots(Sampler):
        def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None,
                          trace_state=None):
            parent = trace.get_current_span(parent_context).get_span_context()
            if not parent.is_valid and attributes and any(k in attributes for k in _NOISY_ROOT_KEYS):
                return SamplingResult(Decision.DROP)
            return ParentBased(ALWAYS_ON).should_sample(parent_context, trace_id, name, kind, attributes, links,
                                                        trace_state)

        def get_description(self) -> str:
            return "QuietRoots(ParentBased(AlwaysOn), no root spans of store queries or bus messages)"

    return QuietRoots()


#: attributes of the instrumentations' spans (asyncpg: db.system, newer semantic conventions
#: db.system.name; faststream: messaging.system)
_NOISY_ROOT_KEYS = ("db.system", "db.system.name", "messaging.system")


def instrument_asyncpg() -> None:
    """A span per asyncpg query (``opentelemetry-instrumentation-asyncpg``), once per process and
    only when this process traces: the stores call it where they open their pool. Query text is
    recorded, never its parameters (workload documents)."""
    if not _configured:
        return
    try:
        from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
    except ImportError:  # an install without the package: no store spans, nothing else changes
        return
    instrumentor = AsyncPGInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument()


def broker_middlewares() -> list:
    """faststream's ``NatsTelemetryMiddleware`` for a service's broker when this process traces:
    a span per handled request (its parent the ``traceparent`` the request carries) and per
    reply. Otherwise none (the handlers then pay nothing for tracing)."""
    if not _configured:
        return []
    from faststream.nats.opentelemetry import NatsTelemetryMiddleware

    # no message counters: the services' own metrics are what /v1/metrics shows
    return [NatsTelemetryMiddleware(include_messages_counters=False)]


_metrics_configured = False
_metric_reader = None


def setup_metrics(service: str, mode: str):
    """The meter of ``service``; the first call with a mode other than ``none`` sets the
    process's meter provider: OTLP export (``otlp``, every ``OTEL_METRIC_EXPORT_INTERVAL`` ms,
    default 60 s) and, for ``memory`` and ``otlp``, a reader the gateway's ``GET /v1/metrics``
    collects on demand."""
    global _metrics_configured, _metric_reader
    from opentelemetry import metrics

    if mode == "none" and _otlp_env_set():
        mode = "otlp"
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        mode = "none"
    if mode not in ("none", "console") and not _metrics_configured:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader, PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        readers = []
        if mode == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            except ImportError:
                log.warning("TIMESHARE_OTEL=otlp needs opentelemetry-exporter-otlp-proto-http; OTLP metrics off")
            else:
                readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        _metric_reader = InMemoryMetricReader()
        readers.append(_metric_reader)
        name = os.environ.get("OTEL_SERVICE_NAME") or "timeshare"
        metrics.set_meter_provider(MeterProvider(resource=Resource.create({"service.name": name}),
                                                 metric_readers=readers))
        _metrics_configured = True
    return metrics.get_meter(f"timeshare.{service}")


def metrics_snapshot() -> dict | None:
    """Every metric of this process now, as JSON-able data (None: metrics are not kept here)."""
    if _metric_reader is None:
        return None
    data = _metric_reader.get_metrics_data()
    out: dict[str, dict] = {}
    for rm in (data.resource_metrics if data else ()):
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points = []
                for p in m.data.data_points:
                    point: dict[str, Any] = {"attributes": dict(p.attributes or {})}
                    if hasattr(p, "bucket_counts"):
                        point.update(count=p.count, sum=p.sum, min=p.min, max=p.max,
                                     bounds=list(p.explicit_bounds), buckets=list(p.bucket_counts))
                    else:
                        point["value"] = p.value
                    points.append(point)
                points.sort(key=lambda x: sorted(x["attributes"].items()))
                out[m.name] = {"unit": m.unit, "description": m.description, "points": points}
    return out


def enabled() -> bool:
    """Whether spans are recorded (so callers skip building attributes for the no-op tracer)."""
    return _configured


def span_store() -> "SpanStore | None":
    return _store


def inject_context(headers: dict, context=None) -> None:
    propagate.inject(headers, context=context)


def extract_context(headers: dict | None):
    return propagate.extract(headers or {})


def attributes_of(prefix: str, obj: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A msgspec struct's fields as span attributes ``<prefix>.<field>`` (None and UNSET left
    out: an attribute may not be None; fields in ``skip`` too)."""
    import msgspec

    out: dict[str, Any] = {}
    for k, v in msgspec.structs.asdict(obj).items():
        if v is None or v is msgspec.UNSET or k in skip:
            continue
        out[f"{prefix}.{k}"] = v if isinstance(v, (str, bool, int, float)) else str(v)
    return out


# -- traces across processes -------------------------------------------------------------------
# Each process keeps its own spans (memory / otlp). A gateway deployed apart from placement and
# the executor asks every process of its cluster for a workload's spans over core NATS
# (``timeshare.query.v1.<cluster>.trace``), gathers the answers for a moment and merges them by
# span id (under ``make run`` every service of the one process answers: the same spans several
# times). The answer is a handler on each service's faststream router (``trace`` in
# services/placement/handlers.py and services/executor/handlers.py): no queue group, so every
# subscriber answers the gateway's one request, each to its reply inbox.


def trace_subject(cluster: str) -> str:
    from . import subjects

    return subjects.query_subject(cluster, "trace")


def trace_answer(cluster: str, workload_id: str | None, trace_id: str | None) -> dict:
    """This process's spans of a workload's trace (of ``trace_id`` when the asker knows it),
    ``{"trace_id", "spans"}``. A process that keeps no spans does not answer (``SkipMessage``)."""
    from faststream.exceptions import SkipMessage

    store = _store
    if store is None:
        raise SkipMessage()
    try:
        trace_id = trace_id or store.trace_of(cluster, str(workload_id))
        return {"trace_id": trace_id, "spans": store.spans_of(trace_id) if trace_id else []}
    except Exception as exc:  # a bad query must not hurt the service
        return {"error": str(exc), "spans": []}


async def gather_trace(bus, cluster: str, workload_id: str, wait_s: float = 0.3) -> dict:
    """A workload's trace from this process's store and every process that answers within
    ``wait_s``: ``{"trace_id", "spans"}`` (spans merged by id, in start order)."""
    import asyncio

    import msgspec

    answers: list[dict] = []
    # the gateway names the trace when it took the submission (its request span carries the
    # workload and the cluster); else the process holding placement's submission span does
    own = _store.trace_of(cluster, workload_id) if _store is not None else None
    inbox = bus.nc.new_inbox()

    async def collect(msg) -> None:
        try:
            answers.append(msgspec.json.decode(msg.data))
        except Exception:  # noqa: BLE001 - an answer we cannot read is left out
            pass

    sub = await bus.nc.subscribe(inbox, cb=collect)
    try:
        await bus.nc.publish(trace_subject(cluster), msgspec.json.encode({"workload_id": workload_id, "trace_id": own}),
                             reply=inbox)
        await asyncio.sleep(wait_s)
    finally:
        await sub.unsubscribe()
    trace_id = own or next((a["trace_id"] for a in answers if a.get("trace_id")), None)
    if trace_id is None:
        return {"trace_id": None, "spans": []}
    spans = {s["span_id"]: s for s in (_store.spans_of(trace_id) if _store is not None else [])}
    for a in answers:
        if a.get("trace_id") == trace_id:
            spans.update({s["span_id"]: s for s in a["spans"]})
    return {"trace_id": trace_id, "spans": sorted(spans.values(), key=lambda s: (s["start_ms"], s["end_ms"], s["span_id"]))}


class SpanStore:
    """A span processor that keeps the latest ``max_spans`` finished spans in memory, by trace,
    and which trace each workload of each cluster belongs to: that of the first span naming both
    (``timeshare.workload_id`` and ``timeshare.cluster``: placement's ``workload.submitted``,
    the child of the HTTP request). Keyed by cluster too: workload ids are unique within a
    cluster only (one process may serve several, as the tests do).

    Implements the SDK's ``SpanProcessor`` interface (on_start / on_end / shutdown /
    force_flush); ``on_end`` runs in the thread that ended the span, so a lock guards it."""

    def __init__(self, max_spans: int):
        self.max_spans = max_spans
        self._spans: deque[dict] = deque()
        self._by_trace: dict[str, list[dict]] = {}
        self._trace_of: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()

    # -- SpanProcessor ------------------------------------------------------------------------
    def on_start(self, span, parent_context=None) -> None:
        pass

    def _on_ending(self, span) -> None:  # newer SDKs call it; nothing to do before the end
        pass

    def on_end(self, span) -> None:
        ctx = span.get_span_context()
        trace_id = format(ctx.trace_id, "032x")
        attrs = dict(span.attributes or {})
        record = {
            "trace_id": trace_id, "span_id": format(ctx.span_id, "016x"),
            "parent_id": format(span.parent.span_id, "016x") if span.parent is not None else None,
            "name": span.name, "service": span.instrumentation_scope.name if span.instrumentation_scope else "",
            "start_ms": span.start_time / 1e6, "end_ms": (span.end_time or span.start_time) / 1e6,
            "status": span.status.status_code.name, "attributes": attrs,
            "events": [{"name": e.name, "at_ms": e.timestamp / 1e6, "attributes": dict(e.attributes or {})}
                       for e in span.events],
            "links": [format(link.context.span_id, "016x") for link in span.links],
        }
        with self._lock:
            self._spans.append(record)
            self._by_trace.setdefault(trace_id, []).append(record)
            wid, cluster = attrs.get("timeshare.workload_id"), attrs.get("timeshare.cluster")
            if isinstance(wid, str) and isinstance(cluster, str) and (cluster, wid) not in self._trace_of:
                self._trace_of[(cluster, wid)] = trace_id
                if len(self._trace_of) > self.max_spans:
                    self._trace_of.popitem(last=False)
            while len(self._spans) > self.max_spans:
                old = self._spans.popleft()
                spans = self._by_trace.get(old["trace_id"])
                if spans:
                    spans.remove(old)
                    if not spans:
                        del self._by_trace[old["trace_id"]]

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    # -- reading ------------------------------------------------------------------------------
    def trace_of(self, cluster: str, workload_id: str) -> str | None:
        with self._lock:
            tid = self._trace_of.get((cluster, workload_id))
            return tid if tid in self._by_trace else None

    def spans_of(self, trace_id: str) -> list[dict]:
        """The trace's spans, earliest start first (copies: the caller may change them)."""
        with self._lock:
            spans = list(self._by_trace.get(trace_id, ()))
        return [dict(s) for s in sorted(spans, key=lambda s: (s["start_ms"], s["end_ms"], s["span_id"]))]
