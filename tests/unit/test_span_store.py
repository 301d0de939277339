"""The in-memory span store behind /v1/workloads/{id}/trace: by trace, bounded, workload -> trace."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from services.common.telemetry import SpanStore


def _tracer(store: SpanStore):
    provider = TracerProvider()  # its own provider: the process's global one is left alone
    provider.add_span_processor(store)
    return provider.get_tracer("test")


def test_a_workloads_trace_holds_its_spans_in_start_order_with_parents():
    store = SpanStore(100)
    tracer = _tracer(store)
    with tracer.start_as_current_span("POST /v1/workloads") as root:
        root.set_attribute("timeshare.workload_id", "w-1")  # no cluster: not indexed
        with tracer.start_as_current_span("placement workload.submitted",
                                          attributes={"timeshare.workload_id": "w-1", "timeshare.cluster": "c"}):
            pass
    # the same id in another cluster is another workload, in another trace
    tracer.start_span("placement workload.submitted", context=trace.set_span_in_context(trace.INVALID_SPAN),
                      attributes={"timeshare.workload_id": "w-1", "timeshare.cluster": "d"}).end()
    with tracer.start_as_current_span("other"):
        pass
    trace_id = store.trace_of("c", "w-1")
    assert trace_id == format(root.get_span_context().trace_id, "032x")
    spans = store.spans_of(trace_id)
    assert [s["name"] for s in spans] == ["POST /v1/workloads", "placement workload.submitted"]
    assert spans[1]["parent_id"] == spans[0]["span_id"] and spans[0]["parent_id"] is None
    assert spans[0]["service"] == "test" and spans[0]["end_ms"] >= spans[0]["start_ms"]
    assert store.trace_of("c", "w-2") is None
    other = store.trace_of("d", "w-1")
    assert other != trace_id and [s["name"] for s in store.spans_of(other)] == ["placement workload.submitted"]


def test_the_oldest_spans_leave_first_and_a_workload_whose_trace_left_is_unknown():
    store = SpanStore(3)
    tracer = _tracer(store)
    for i in range(5):
        tracer.start_span(f"s{i}", context=trace.set_span_in_context(trace.INVALID_SPAN),
                          attributes={"timeshare.workload_id": f"w-{i}", "timeshare.cluster": "c"}).end()
    assert store.trace_of("c", "w-0") is None and store.trace_of("c", "w-1") is None
    assert [s["name"] for s in store.spans_of(store.trace_of("c", "w-4"))] == ["s4"]
    assert sum(len(store.spans_of(store.trace_of("c", f"w-{i}"))) for i in (2, 3, 4)) == 3
    # the first span naming a workload decides its trace (a repeated submission keeps it)
    tracer.start_span("again", attributes={"timeshare.workload_id": "w-4", "timeshare.cluster": "c"}).end()
    assert [s["name"] for s in store.spans_of(store.trace_of("c", "w-4"))] == ["s4"]
