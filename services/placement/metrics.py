"""Placement's OpenTelemetry metrics: what the scheduler holds now (queue length, busy GPUs
allocated and unallocated, occupancy, usage ratio per tree node, read from the state when the
metrics are collected) and what its passes decided (queue waits by kind, preemptions by reason
and rule, drains), counted as decisions are made. The shell only: the core stays pure."""

from __future__ import annotations

import weakref

import msgspec
from opentelemetry.metrics import CallbackOptions, Observation

from timeshare import events as ev
from timeshare.fairshare import FairShareView

#: queue waits span seconds (debug work) to days (large gangs)
WAIT_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 2 * 3600, 6 * 3600, 12 * 3600, 86400, 3 * 86400)


class _Instruments:
    """One set of instruments per process: a meter keeps the first instrument of a name and
    ignores the callbacks of a second, so the gauges are registered once and observe every live
    placement of the process (one in a deployment; a test process starts many)."""

    def __init__(self, meter):
        self.live: "weakref.WeakSet[PlacementMetrics]" = weakref.WeakSet()
        self.waits = meter.create_histogram(
            "timeshare.queue.wait", unit="s", description="time from submission (or requeue) to start, by kind",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS_S)
        self.preemptions = meter.create_counter(
            "timeshare.preemptions", unit="{preemption}", description="preemptions by reason kind and rule")
        self.drains = meter.create_counter("timeshare.drains", unit="{node}", description="nodes drained")
        self.notices = meter.create_counter(
            "timeshare.notices", unit="{notice}", description="preemptions that began with a notice, by reason kind")
        self.checkpoint_gpu_s = meter.create_counter(
            "timeshare.checkpoint.gpu_time", unit="s",
            description="GPU-seconds victims held their GPUs under notice (checkpoint overhead, apart from lost work)")
        for name, method, unit, description in (
                ("timeshare.queue.length", "_queue", "{workload}", "pending workloads per GPU type and phase"),
                ("timeshare.gpus.busy", "_busy", "{gpu}", "GPUs running work, allocated or unallocated, per GPU type"),
                ("timeshare.occupancy", "_occupancy", "1", "busy GPUs / GPUs per GPU type"),
                ("timeshare.usage_ratio", "_ratios", "1", "allocated GPU-s in the window / the share's, per tree node")):
            meter.create_observable_gauge(name, [self._every(method)], unit=unit, description=description)

    def _every(self, method: str):
        def observe(options: CallbackOptions):
            return [o for m in list(self.live) for o in getattr(m, method)(options)]
        return observe


_instruments: _Instruments | None = None


class PlacementMetrics:
    def __init__(self, meter, placement):
        global _instruments
        if _instruments is None:
            _instruments = _Instruments(meter)
        self.waits, self.preemptions, self.drains = _instruments.waits, _instruments.preemptions, _instruments.drains
        self.notices, self.checkpoint_gpu_s = _instruments.notices, _instruments.checkpoint_gpu_s
        # a weak reference: the process's meter provider outlives a test's placement; a stopped
        # or collected placement observes nothing
        self._placement = weakref.ref(placement)
        self.cluster = placement.cluster
        _instruments.live.add(self)

    @property
    def placement(self):
        p = self._placement()
        return None if p is None or p.stop_event.is_set() or not p.leader.is_set() else p

    def _state(self):
        p = self.placement
        return None if p is None else p.state

    def decided(self, decisions: list[ev.Event]) -> None:
        state = self._state()
        if state is None:
            return
        for e in decisions:
            if isinstance(e, ev.WorkloadStarted):
                w = state.workloads.get(e.workload_id)
                if w is not None:
                    self.waits.record(max(0.0, e.at_ms / 1000 - w.queued_since_s),
                                      {"cluster": self.cluster, "kind": w.spec.kind, "gpu_type": e.gpu_type,
                                       "allocated": e.allocated})
            elif isinstance(e, ev.WorkloadPreempted):
                attrs = {"cluster": self.cluster, "reason": e.reason.kind, "rule": e.reason.rule or ""}
                if e.checkpointed is not msgspec.UNSET:  # after a notice: checkpointed, or ended at the deadline
                    attrs["notice"] = "checkpointed" if e.checkpointed else "deadline"
                    self.checkpoint_gpu_s.add(e.checkpoint_gpu_s or 0, {"cluster": self.cluster})
                self.preemptions.add(1, attrs)
            elif isinstance(e, ev.WorkloadPreemptionNotice):
                self.notices.add(1, {"cluster": self.cluster, "reason": e.reason.kind})
            elif isinstance(e, ev.NodeDrained):
                self.drains.add(1, {"cluster": self.cluster})

    # -- observed when collected ------------------------------------------------------------
    def _queue(self, _options: CallbackOptions):
        state = self._state()
        if state is None:
            return []
        counts: dict[tuple[str, str], int] = {}
        for (gpu_type, _leaf, cls), q in list(state.queues.items()):
            key = (gpu_type, "allocated" if cls == "a" else "unallocated")
            counts[key] = counts.get(key, 0) + q.count
        return [Observation(n, {"cluster": self.cluster, "gpu_type": g, "phase": p}) for (g, p), n in sorted(counts.items())]

    def _busy_by_type(self, state) -> dict[tuple[str, bool], int]:
        busy = {(gt, a): 0 for gt in state.cluster.pools for a in (True, False)}
        for w in list(state.running.values()):
            busy[(w.gpu_type, bool(w.allocated))] += w.gpus
        return busy

    def _busy(self, _options: CallbackOptions):
        state = self._state()
        if state is None:
            return []
        return [Observation(n, {"cluster": self.cluster, "gpu_type": g, "allocated": a})
                for (g, a), n in sorted(self._busy_by_type(state).items())]

    def _occupancy(self, _options: CallbackOptions):
        state = self._state()
        if state is None:
            return []
        busy = self._busy_by_type(state)
        return [Observation((busy[(gt, True)] + busy[(gt, False)]) / pool.total_gpus if pool.total_gpus else 0.0,
                            {"cluster": self.cluster, "gpu_type": gt}) for gt, pool in sorted(state.cluster.pools.items())]

    def _ratios(self, _options: CallbackOptions):
        state = self._state()
        if state is None:
            return []
        try:
            return self._ratios_of(state)
        except Exception:  # noqa: BLE001 - an exporter thread read the state mid-pass: next time
            return []

    def _ratios_of(self, state):
        p = self.placement
        if p is None:
            return []
        now_s = p._now_ms() / 1000
        out = []
        for gt, pool in sorted(state.cluster.pools.items()):
            view = FairShareView(state.tree, state.ledger, gt, pool.total_gpus, now_s)
            for path in sorted(state.tree.nodes):
                ratio = view.ratios[path]
                if ratio != float("inf"):
                    out.append(Observation(ratio, {"cluster": self.cluster, "gpu_type": gt, "node": path}))
        return out
