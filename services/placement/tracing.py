"""Placement's spans: one trace per workload, its decisions' spans ended once the log holds them.

A mixin of ``Placement`` (service.py), whose ``__init__`` declares the state it reads and sets.
"""

from __future__ import annotations

import msgspec
from opentelemetry import trace

from timeshare import events as ev

from ..common import telemetry


class DecisionTracing:
    # -- traces -----------------------------------------------------------------------------
    # One trace per workload: the gateway's HTTP span -> "placement workload.submitted" (here,
    # child of the traceparent the proposal carried) -> one span per decision about it, child
    # of that, timed like the pass that made it and linked to the pass's own span -> the
    # executor's report -> "placement workload.completed". Each log message carries the context
    # of its event's span, so services downstream continue the workload's trace.
    def _trace_input(self, e: ev.Event, msg) -> None:
        if not telemetry.enabled():
            return
        wid = e.workload.id if isinstance(e, ev.WorkloadSubmitted) else getattr(e, "workload_id", None)
        if wid is None:
            return
        headers = msg.headers or {}
        parent = telemetry.extract_context(headers) if "traceparent" in headers else self.trace_ctx.get(wid)
        attrs = {"timeshare.workload_id": wid, "timeshare.event_id": e.event_id, "timeshare.at_ms": e.at_ms,
                 "timeshare.cluster": self.cluster}
        if isinstance(e, ev.WorkloadSubmitted):
            w = e.workload
            attrs.update({"timeshare.project": w.project, "timeshare.user": w.user, "timeshare.gpu_type": w.gpu_type,
                          "timeshare.gpus": w.gpus, "timeshare.min_runtime_s": w.min_runtime_s,
                          "timeshare.resumable": w.resumable, "timeshare.kind": w.kind})
        span = self.tracer.start_span(f"placement {ev.event_type(e)}", context=parent, attributes=attrs)
        self.open_spans.append(span)  # ended once the log holds it (_append)
        ctx = trace.set_span_in_context(span)
        if isinstance(e, ev.WorkloadSubmitted):
            self.trace_ctx[wid] = ctx
        self.event_ctx[e.event_id] = ctx

    def _trace_decisions(self, decisions: list[ev.Event], pass_span, start_ns: int) -> None:
        """A span per decision in its workload's trace, with the numbers that justified it."""
        link = [trace.Link(pass_span.get_span_context())]
        for e in decisions:
            wid = getattr(e, "workload_id", None)
            if wid is None:
                continue
            attrs: dict = {"timeshare.workload_id": wid, "timeshare.event_id": e.event_id,
                           "timeshare.at_ms": e.at_ms, "timeshare.cluster": self.cluster}
            if isinstance(e, ev.WorkloadStarted):
                attrs.update({"timeshare.project": e.project, "timeshare.gpus": e.gpus,
                              "timeshare.nodes": ",".join(p.node for p in e.placement),
                              "timeshare.allocated": e.allocated, "timeshare.attempt": e.attempt})
                if e.protected_until_ms is not None:
                    attrs["timeshare.protected_until_ms"] = e.protected_until_ms
            elif isinstance(e, ev.WorkloadPreempted):
                attrs.update(telemetry.attributes_of("timeshare.preemption", e.reason, skip=("rejected",)))
                attrs.update({"timeshare.resumable": e.resumable, "timeshare.progress_s": e.progress_s,
                              "timeshare.lost_gpu_s": e.lost_gpu_s})
                if e.checkpointed is not msgspec.UNSET:  # after a notice
                    attrs.update({"timeshare.checkpointed": e.checkpointed,
                                  "timeshare.checkpoint_gpu_s": e.checkpoint_gpu_s})
            elif isinstance(e, ev.WorkloadPreemptionNotice):
                attrs.update(telemetry.attributes_of("timeshare.preemption", e.reason, skip=("rejected",)))
                attrs.update({"timeshare.deadline_ms": e.deadline_ms, "timeshare.attempt": e.attempt or 0})
            # a workload whose trace is unknown (submitted before a snapshot) hangs under the pass
            parent = self.trace_ctx.get(wid)
            span = self.tracer.start_span(f"placement.pass {ev.event_type(e)}", context=parent, links=link,
                                          start_time=start_ns, attributes=attrs)
            if isinstance(e, ev.WorkloadPreempted):
                span.add_event("preempted", {"timeshare.message": e.reason.message})
                # the closest candidates it did not take, and why: the data explain's sentence is made of
                for c in e.reason.rejected or ():
                    span.add_event("rejected", telemetry.attributes_of("timeshare.rejected", c))
            self.open_spans.append(span)  # ended once the log holds the decision (_append)
            self.event_ctx[e.event_id] = trace.set_span_in_context(span)

    def _end_spans(self, appended: bool) -> None:
        """End the spans of this batch's events: a decision is made when the log holds it. A
        batch the log refused (a deposed leader, a term that ended) is marked: the next leader
        decides again, with other event ids, in spans of its own. The metrics count only what
        the log holds, for the same reason."""
        for span in self.open_spans:
            span.set_attribute("timeshare.appended", appended)
            if not appended:
                span.set_status(trace.Status(trace.StatusCode.ERROR, "not appended to the log: the term ended"))
            span.end()
        self.open_spans.clear()
        if appended:
            self.metrics.decided(self.decided)
        self.decided.clear()
