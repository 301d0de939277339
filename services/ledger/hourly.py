"""Hourly usage rows: what the ledger's report reads instead of the whole journal.

The ledger feeds every event it folds to the simulator's own ``MetricsCollector`` (the one
definition of owed / delivered / attainment, ``timeshare.sim.metrics``), which bins GPU-seconds
by hour and (team, GPU type). Each time the event time crosses an hour boundary, every rate is
integrated up to that boundary and the hours before it are complete: each becomes one **row**
(``hourly`` / ``<cluster>:<hour>``), with

* ``delivered`` / ``demand`` / ``delivered_funded`` / ``demand_funded``: GPU-seconds per
  ``<team>|<GPU type>`` (the bins ``attainment_of`` reads);
* ``in_service``, ``busy``, ``unallocated``: GPU-seconds per GPU type (occupancy, unallocated share);
* ``preemptions``: count per reason; ``waits_s``: the first queue wait of each workload that
  first started in that hour;
* ``waste_gpu_s``: GPU-seconds wasted by the ends in that hour, as the collector counts them
  (``wasted_gpu_hours`` and its parts): ``lost`` (progress a preemption lost, the event's
  ``lost_gpu_s``), ``checkpoint`` (GPU time held under notice writing a checkpoint, its
  ``checkpoint_gpu_s``) and ``total`` (those two and the run time of failed work).

The complete hours leave memory once written; only the open hour is kept live. A report over
``[from_s, to_s)`` reads the rows of its hours and, when it reaches past the last complete hour,
the open hour integrated up to ``to_s``, then calls ``attainment_of`` on them: the same numbers
as the collector fed the raw journal (``tests/integration/test_report_hourly.py`` holds the two
equal). Splitting an integration at an hour boundary is the same arithmetic ``_Rates`` does
itself, so the sums are equal, not just close.
"""

from __future__ import annotations

import copy
import logging
import math
from collections import defaultdict

from timeshare import events as ev
from timeshare.sim.metrics import HOUR_S, MetricsCollector, _Rates, percentiles
from timeshare.tree import AllocationTree

log = logging.getLogger("timeshare.ledger.hourly")

#: a leap of event time longer than this is not binned hour by hour (see HourlyUsage._jump_to)
MAX_GAP_H = 400 * 24

#: the four bins of attainment_of, keyed (team, GPU type)
TEAM_RATES = ("delivered", "demand", "delivered_funded", "demand_funded")

#: a row's waste, each the change of one of the collector's sums: (row key, collector attribute)
WASTE = (("lost", "lost_gpu_s"), ("checkpoint", "checkpoint_gpu_s"), ("total", "wasted_gpu_s"))


def _key(k) -> str:
    return f"{k[0]}|{k[1]}"


def _unkey(s: str) -> tuple[str, str]:
    leaf, _, pool = s.rpartition("|")
    return leaf, pool


def _counts() -> dict[str, int]:
    # a named function, not a lambda: the ledger pickles these rows' state into its checkpoint
    return defaultdict(int)


def _sums() -> dict[str, float]:
    return defaultdict(float)


class HourlyUsage:
    def __init__(self, tree: AllocationTree, pool_gpus: dict[str, int], nodes: dict[str, tuple[str, int]],
                 max_min_runtime_s: int):
        self.pool_gpus = pool_gpus
        self.nodes = nodes
        self.max_min_runtime_s = max_min_runtime_s
        self.mc = MetricsCollector(tree, pool_gpus, max_min_runtime_s)
        self.busy = _Rates()          # pool -> running GPUs
        self.unallocated = _Rates()   # pool -> running GPUs of unallocated work
        self.preemptions: dict[int, dict[str, int]] = defaultdict(_counts)
        self.waits: dict[int, list[float]] = defaultdict(list)
        self.waste: dict[int, dict[str, float]] = defaultdict(_sums)
        self.started = False
        #: the hour the latest event fell in: every hour before it is complete
        self.open_h: int | None = None
        #: the first hour with data (the report refuses ranges that end before it)
        self.first_h: int | None = None
        self.first_s: float | None = None  # the first event's time (the report's span)
        #: complete rows not yet written to the store: hour -> row
        self.unwritten: dict[int, dict] = {}
        #: [from, to) hours skipped by a leap of event time (no rows)
        self.gaps: list[tuple[int, int]] = []

    def _rates(self) -> list[_Rates]:
        mc = self.mc
        return [mc.delivered, mc.demand, mc.delivered_funded, mc.demand_funded, mc.in_service,
                self.busy, self.unallocated]

    def _fits(self, e: ev.Event) -> bool:
        """False for an event the collector cannot take: about a workload whose submission the
        ledger never stored (dead-lettered: a NUL in a field), or a stop of work not running."""
        mc = self.mc
        match e:
            case ev.WorkloadStarted() | ev.WorkloadFailed() | ev.WorkloadCancelled():
                return e.workload_id in mc.specs
            case ev.WorkloadPreempted() | ev.WorkloadCompleted():
                return e.workload_id in mc.running and e.workload_id in mc.specs
            case ev.NodeFailed() | ev.NodeDrained() | ev.NodeRepaired():
                return e.node in mc.node_pool or not self.started
        return True

    def observe(self, e: ev.Event) -> None:
        if not self._fits(e):
            return
        t = e.at_ms / 1000
        h = int(t // HOUR_S)
        if not self.started:
            self.started = True
            self.mc.start(t, self.nodes)
            self.open_h = self.first_h = h
            self.first_s = t
        elif h - self.open_h > MAX_GAP_H:
            self._jump_to(h)
        elif h > self.open_h:
            self._complete_hours_before(h)
        mc = self.mc
        match e:
            case ev.WorkloadStarted():
                if e.workload_id not in mc.first_wait and e.workload_id in mc.submit_s:
                    self.waits[h].append(t - mc.submit_s[e.workload_id])
                self.busy.change(e.gpu_type, t, e.gpus)
                if not e.allocated:
                    self.unallocated.change(e.gpu_type, t, e.gpus)
            case ev.WorkloadPreempted() | ev.WorkloadCompleted() | ev.WorkloadFailed() | ev.WorkloadCancelled():
                run = mc.running.get(e.workload_id)
                if run is not None:
                    _, gpus, allocated, _, pool, _ = run
                    self.busy.change(pool, t, -gpus)
                    if not allocated:
                        self.unallocated.change(pool, t, -gpus)
                if isinstance(e, ev.WorkloadPreempted):
                    self.preemptions[h][e.reason.kind] += 1
            case ev.BudgetChanged():
                # funded from now on as the new tree says (the hours before keep theirs); after
                # the hours before it are complete, so that the change falls in its own hour. The
                # collector holds only live work here (_forget), so its specs are the live ones
                mc.set_tree(ev.tree_after(e, mc.tree), t, list(mc.specs))
        before = [getattr(mc, attr) for _, attr in WASTE]
        mc.observe(e)
        for (name, attr), sum_before in zip(WASTE, before):  # one definition of waste: the collector's
            if getattr(mc, attr) != sum_before:
                self.waste[h][name] += getattr(mc, attr) - sum_before
        if ev.ends_for_good(e):  # its last event: nothing about it follows
            self._forget(e.workload_id)

    def _forget(self, workload_id: str) -> None:
        """Drop what the collector keeps per workload once it ended: the rows need only live
        work (its demand and delivery), and the ledger's memory and checkpoint stay as large
        as the work in the system, not as its history. (The simulator's collector keeps them
        for its end-of-run tables.)"""
        mc = self.mc
        for per_workload in (mc.specs, mc.submit_s, mc.resubmit_of, mc.first_wait, mc.requeued_at):
            per_workload.pop(workload_id, None)
        # requeue waits are the simulator's table; the rows keep their own (waits_s)
        mc.requeue_waits.clear()
        mc.requeue_waits_by_kind.clear()

    def _jump_to(self, h: int) -> None:
        """Event time leapt more than MAX_GAP_H hours (an event stamped at 0 ms, the epoch,
        then the wall clock: 495,000 hours, which binned hour by hour took every service down):
        the open hour is completed, the hours in between get no rows, and the rates go on
        from hour ``h``. A report never spans such a gap (ranges are at most 400 days)."""
        self._complete_hours_before(self.open_h + 1)
        boundary = h * HOUR_S
        for rates in self._rates():
            rates.restart_at(boundary)
        log.warning("event time jumped from hour %d to %d: the hours between are not binned", self.open_h, h)
        self.gaps.append((self.open_h, h))
        self.open_h = h

    def in_gap(self, hour: int) -> bool:
        return any(a <= hour < b for a, b in self.gaps)

    def _complete_hours_before(self, h: int) -> None:
        boundary = h * HOUR_S
        for rates in self._rates():  # every since is at or before the latest event, so before boundary
            rates.close(boundary)
        for hour in range(self.open_h, h):
            row = self._row(hour)
            if row is not None:
                self.unwritten[hour] = row
            for rates in self._rates():
                for bins in rates.bins.values():
                    bins.pop(hour, None)
            self.preemptions.pop(hour, None)
            self.waits.pop(hour, None)
            self.waste.pop(hour, None)
        self.open_h = h

    def _row(self, hour: int) -> dict | None:
        mc = self.mc
        row: dict = {"hour": hour}
        for name, rates in zip(TEAM_RATES, (mc.delivered, mc.demand, mc.delivered_funded, mc.demand_funded)):
            row[name] = {_key(k): b[hour] for k, b in sorted(rates.bins.items()) if b.get(hour)}
        for name, rates in (("in_service", mc.in_service), ("busy", self.busy), ("unallocated", self.unallocated)):
            row[name] = {k: b[hour] for k, b in sorted(rates.bins.items()) if b.get(hour)}
        row["preemptions"] = dict(sorted(self.preemptions.get(hour, {}).items()))
        row["waits_s"] = list(self.waits.get(hour, []))
        waste = self.waste.get(hour, {})
        row["waste_gpu_s"] = {name: waste.get(name, 0.0) for name, _ in WASTE}
        return row

    def open_rows(self, to_s: float) -> dict[int, dict]:
        """The hours not yet complete (the open one, and any up to ``to_s``), integrated up to
        ``to_s`` on copies: the live state is not touched."""
        if not self.started or to_s <= self.open_h * HOUR_S:
            return {}
        scratch = copy.copy(self)
        scratch.mc = copy.copy(self.mc)
        for name in ("delivered", "demand", "delivered_funded", "demand_funded", "in_service"):
            setattr(scratch.mc, name, getattr(self.mc, name).copy())
        scratch.busy, scratch.unallocated = self.busy.copy(), self.unallocated.copy()
        last_h = int(math.ceil(to_s / HOUR_S))
        for rates in scratch._rates():
            rates.close(to_s)
        return {h: scratch._row(h) for h in range(self.open_h, last_h)}


def report_from_rows(rows: list[dict], tree: AllocationTree, pool_gpus: dict[str, int], max_min_runtime_s: int,
                     from_s: float | None, to_s: float, first_s: float | None = None) -> dict:
    """The report over ``[from_s, to_s)`` from hourly rows (the hours of the range, in order);
    ``first_s``: the ledger's first event (an hour it covers in part owes that part)."""
    mc = MetricsCollector(tree, pool_gpus, max_min_runtime_s)
    in_service = busy = unallocated = 0.0
    preemptions: dict[str, int] = defaultdict(int)
    waits: list[float] = []
    waste = {name: 0.0 for name, _ in WASTE}
    for row in rows:
        h = row["hour"]
        for name in TEAM_RATES:
            rates = getattr(mc, name)
            for k, gpu_s in row[name].items():
                rates.bins[_unkey(k)][h] += gpu_s
        in_service += sum(row["in_service"].values())
        busy += sum(row["busy"].values())
        unallocated += sum(row["unallocated"].values())
        for reason, n in row["preemptions"].items():
            preemptions[reason] += n
        waits += row["waits_s"]
        for name, gpu_s in row.get("waste_gpu_s", {}).items():  # rows stored before waste: none
            waste[name] += gpu_s
    since_h = -math.inf if from_s is None else from_s / HOUR_S
    span_s = (first_s if first_s is not None else -math.inf, to_s)
    funded_teams, funded = mc.attainment_of(mc.delivered_funded, mc.demand_funded, since_h, span_s)
    all_teams, all_work = mc.attainment_of(mc.delivered, mc.demand, since_h, span_s)
    teams = {}
    for leaf in tree.leaves:
        f, a = funded_teams[leaf], all_teams[leaf]
        teams[leaf] = {"fraction": round(tree.nodes[leaf].fraction, 6), "owed_gpu_hours": f["owed_gpu_hours"],
                       "delivered_gpu_hours": f["delivered_gpu_hours"], "attainment": f["attainment"],
                       "attainment_all_work": a["attainment"]}
    return {
        "from_s": from_s, "to_s": to_s, "teams": teams, "attainment": funded, "attainment_all_work": all_work,
        # over the hours of the range (the report from the raw journal counted these from its start)
        "occupancy": round(busy / in_service, 6) if in_service else 0.0,
        "unallocated_share": round(unallocated / busy, 6) if busy else 0.0,
        "preemptions": sum(preemptions.values()), "preemptions_by_reason": dict(sorted(preemptions.items())),
        # the first queue wait of each workload that first started in the range
        "queue_wait_s": percentiles(waits),
        # what the preemptions (and failures) of the range wasted, as the simulator reports it
        **waste_report(waste["lost"], waste["checkpoint"], waste["total"], busy),
        "hours": len(rows),
    }


def waste_report(lost_gpu_s: float, checkpoint_gpu_s: float, wasted_gpu_s: float, delivered_gpu_s: float) -> dict:
    """The simulator's waste figures (``MetricsCollector.finish``): ``wasted_gpu_hours`` (progress
    lost to preemption + GPU time writing checkpoints on notice + run time of failed work) and
    its two preemption parts apart, with the total per 1,000 GPU-hours delivered."""
    return {"wasted_gpu_hours": round(wasted_gpu_s / HOUR_S, 3),
            "waste": {"lost_gpu_hours": round(lost_gpu_s / HOUR_S, 3),
                      "checkpoint_gpu_hours": round(checkpoint_gpu_s / HOUR_S, 3),
                      "per_1000_delivered_gpu_hours": round(1000 * wasted_gpu_s / delivered_gpu_s, 3)
                      if delivered_gpu_s else 0.0}}


def series_from_rows(rows: list[dict], tree: AllocationTree, pool_gpus: dict[str, int], max_min_runtime_s: int,
                     node: str, from_s: float | None, to_s: float, first_s: float | None, bucket_h: int) -> dict:
    """Owed and delivered GPU-hours of funded work of tree node ``node`` ("" = every team) over
    ``[from_s, to_s)``, per bucket of ``bucket_h`` whole hours: each bucket is
    :func:`report_from_rows` over its hours, summed over the teams under ``node``, so the
    buckets add up to the report over the same range (each team's figures are rounded to
    1/1000 GPU-h per bucket). ``entitled_gpu_hours``: the node's fraction of the GPUs over the
    seconds the bucket covers (owed is that, capped by what the teams asked for)."""
    leaves = [leaf for leaf in tree.leaves if not node or leaf == node or leaf.startswith(node + "/")]
    fraction = 1.0 if not node else tree.nodes[node].fraction
    gpus = sum(pool_gpus.values())
    start = first_s if from_s is None else (from_s if first_s is None else max(from_s, first_s))
    if start is None or start >= to_s:
        return {"node": node, "from_s": from_s, "to_s": to_s, "bucket_s": bucket_h * HOUR_S, "buckets": []}
    by_hour = {row["hour"]: row for row in rows}
    first_b = int(start // HOUR_S) // bucket_h * bucket_h
    buckets = []
    for b in range(first_b, int(math.ceil(to_s / HOUR_S)), bucket_h):
        b_from, b_to = b * HOUR_S, min((b + bucket_h) * HOUR_S, to_s)
        part = [by_hour[h] for h in range(b, b + bucket_h) if h in by_hour]
        # the bucket's hours whole (as the report counts the hour from_s falls in), up to to_s
        report = report_from_rows(part, tree, pool_gpus, max_min_runtime_s, b_from, b_to, first_s)
        teams = report["teams"]
        covered_s = max(0.0, b_to - max(b_from, first_s if first_s is not None else b_from))
        buckets.append({
            "from_s": b_from, "to_s": b_to,
            "owed_gpu_hours": round(sum(teams[leaf]["owed_gpu_hours"] for leaf in leaves), 3),
            "delivered_gpu_hours": round(sum(teams[leaf]["delivered_gpu_hours"] for leaf in leaves), 3),
            "entitled_gpu_hours": round(fraction * gpus * covered_s / HOUR_S, 3),
        })
    return {"node": node, "fraction": round(fraction, 6), "from_s": from_s, "to_s": to_s,
            "bucket_s": bucket_h * HOUR_S, "buckets": buckets}
