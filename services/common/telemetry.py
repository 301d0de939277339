"""OpenTelemetry: a tracer per service, trace context carried in NATS headers.

With TIMESHARE_OTEL=none (the default) spans are created by the API's no-op tracer and cost
almost nothing; "console" prints them, "otlp" exports to OTEL_EXPORTER_OTLP_ENDPOINT when the
OTLP exporter package is installed.
"""

from __future__ import annotations

import logging

from opentelemetry import propagate, trace

_configured = False


def setup_telemetry(service: str, mode: str) -> trace.Tracer:
    global _configured
    if mode != "none" and not _configured:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        provider = TracerProvider(resource=Resource.create({"service.name": f"timeshare-{service}"}))
        if mode == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif mode == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                logging.getLogger("timeshare").warning("TIMESHARE_OTEL=otlp needs opentelemetry-exporter-otlp; tracing off")
            else:
                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        _configured = True
    return trace.get_tracer(f"timeshare.{service}")


def inject_context(headers: dict) -> None:
    propagate.inject(headers)


def extract_context(headers: dict | None):
    return propagate.extract(headers or {})
