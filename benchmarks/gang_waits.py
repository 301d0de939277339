"""First-start waits of allocated work by size, from one run's event log (issue 24's table).

    python benchmarks/gang_waits.py SCENARIO EVENTS [--kind training] [--set KEY=VALUE ...]

Per GPU count: how many workloads started (or still wait), and the p50 / p90 / max of the wait
from submission to the first start (work still pending at the end counts with its wait so
far). For whole-node gangs also the part of that wait during which the gang was *entitled*
(the referee's "gang starved": its leaf's path within its fraction with it, and enough whole
nodes whose work may go once protections end), and the part during which its leaf alone would
have run within its fraction with it (issue 24's words), each next to ``max_min_runtime``, the
wait the contract makes necessary. Fractions stand in for due shares (exact under
``catch_up = 0``). Prints numbers; asserts nothing. Reads only the events and the
scenario (it runs the referee, timeshare.sim.referee).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "shared"))

from timeshare import events as ev  # noqa: E402
from timeshare.durations import format_duration_s  # noqa: E402
from timeshare.sim.cli import parse_overrides  # noqa: E402
from timeshare.sim.metrics import percentiles  # noqa: E402
from timeshare.sim.referee import Referee  # noqa: E402
from timeshare.sim.scenario import load_scenario  # noqa: E402


def _h(seconds: float) -> str:
    return "0" if seconds <= 0 else format_duration_s(int(round(seconds)))


def gang_table(scenario, events: list, kind: str | None = None) -> tuple[list[dict], list]:
    """Rows of the table (one per GPU count, ascending) and the referee's findings."""
    referee = Referee(scenario)
    findings = referee.read(events)
    end_s = scenario.duration_s
    specs: dict[str, ev.WorkloadSpec] = {}
    first: dict[str, float] = {}
    for e in events:
        if isinstance(e, ev.WorkloadSubmitted):
            if e.resubmit_of is None:
                specs[e.workload.id] = e.workload
        elif isinstance(e, ev.WorkloadStarted) and e.workload_id in specs and e.workload_id not in first:
            first[e.workload_id] = e.at_ms / 1000 - specs[e.workload_id].submit_s
    entitled: dict[str, float] = {}
    within: dict[str, float] = {}
    for w in referee.gang_waits:
        if w.first:
            entitled[w.workload_id] = w.entitled_s
            within[w.workload_id] = w.within_s
    end_ms = int(end_s * 1000)
    for wid in referee.pending_gangs:  # still pending at the end: the time so far
        if wid in specs and wid not in first:
            entitled[wid] = referee.gang_entitled.total_ms(wid, end_ms) / 1000
            within[wid] = referee.gang_within.total_ms(wid, end_ms) / 1000
    waits: dict[int, list[float]] = defaultdict(list)
    ent: dict[int, list[float]] = defaultdict(list)
    inside: dict[int, list[float]] = defaultdict(list)
    pending: dict[int, int] = defaultdict(int)
    for wid in sorted(specs):
        spec = specs[wid]
        if spec.min_runtime_s <= 0 or (kind is not None and spec.kind != kind):
            continue
        wait = first.get(wid)
        if wait is None:
            wait = end_s - spec.submit_s
            pending[spec.gpus] += 1
        waits[spec.gpus].append(wait)
        if wid in entitled:
            ent[spec.gpus].append(entitled[wid])
            inside[spec.gpus].append(within[wid])
    rows = []
    for gpus in sorted(waits):
        row = {"gpus": gpus, "count": len(waits[gpus]), "pending": pending[gpus], "wait": percentiles(waits[gpus])}
        if gpus in ent:
            term_s = scenario.policy.max_min_runtime_s
            row["entitled"] = percentiles(ent[gpus])
            row["entitled_over_term"] = sum(1 for x in ent[gpus] if x > term_s)
            row["within"] = percentiles(inside[gpus])
            row["within_over_term"] = sum(1 for x in inside[gpus] if x > term_s)
        rows.append(row)
    return rows, findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario")
    parser.add_argument("events")
    parser.add_argument("--kind", default="training", help="workload kind (default training; 'all': every kind)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    scenario = load_scenario(args.scenario, parse_overrides(args.set))
    t0 = time.process_time()
    with open(args.events, "rb") as f:
        events = [ev.decoder.decode(line) for line in f if line.strip()]
    rows, findings = gang_table(scenario, events, None if args.kind == "all" else args.kind)
    term = _h(scenario.policy.max_min_runtime_s)
    print(f"| gang | count | pending at end | wait p50 | p90 | max | entitled: p50 | p90 | max | > {term} "
          f"| leaf within share: p50 | p90 | max | > {term} |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        w = r["wait"]
        cells = [f"{r['gpus']} GPUs", str(r["count"]), str(r["pending"]), _h(w["p50"]), _h(w["p90"]), _h(w["max"])]
        if "entitled" in r:
            e = r["entitled"]
            i = r["within"]
            cells += [_h(e["p50"]), _h(e["p90"]), _h(e["max"]), str(r["entitled_over_term"]),
                      _h(i["p50"]), _h(i["p90"]), _h(i["max"]), str(r["within_over_term"])]
        else:
            cells += [""] * 8
        print("| " + " | ".join(cells) + " |")
    kinds: dict[str, int] = defaultdict(int)
    for f in findings:
        kinds[f.kind] += 1
    print(f"referee: {len(findings)} findings" + (f" ({dict(sorted(kinds.items()))})" if kinds else "")
          + f"; {time.process_time() - t0:.1f} s CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
