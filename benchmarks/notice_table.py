"""The table of docs/records/2026-12-02-notice.md from simulate's output directories.

    python benchmarks/notice_table.py NAME=DIR ...   (the first NAME is the no-notice run)

Each DIR holds metrics.json of one policy (``--policy budget`` or ``--policy baseline``) or of
several (``--policy all``); a NAME may come twice (its budget and its baseline directory).
Prints one Markdown row per run and policy; "× old" divides by the old scheduler's (baseline)
preemptions in the first run and in the same run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _runs(directory: Path) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for path in sorted(directory.rglob("metrics.json")):
        m = json.loads(path.read_text())
        if "occupancy" in m:  # one policy: its name is the events' folder beside it
            policies = [p.name for p in path.parent.iterdir() if (p / "events.jsonl").exists()]
            out[policies[0] if policies else path.parent.name] = m
        else:
            out.update({p: v for p, v in m.items() if isinstance(v, dict) and "occupancy" in v})
    return out


def main(args: list[str]) -> int:
    merged: dict[str, dict[str, dict]] = {}
    for name, d in (a.split("=", 1) for a in args):
        merged.setdefault(name, {}).update(_runs(Path(d)))
    runs = list(merged.items())
    old = runs[0][1].get("baseline")
    print("| run | policy | wasted GPU-h (lost + checkpoint) | per 1,000 delivered GPU-h | funded attainment fleet "
          "/ worst team | debug p90 | occupancy | preemptions (× old of the first run / of this run) | "
          "sessions preempted / state lost | notices (checkpointed / killed) | storage peak GB/s |")
    print("|---" * 11 + "|")
    for name, policies in runs:
        same = policies.get("baseline")
        for policy in ("budget", "baseline"):
            m = policies.get(policy)
            if m is None:
                continue
            w, n, s = m["waste"], m["notices"], m["sessions"]
            ratio = " / ".join(f"{m['preemptions'] / b['preemptions']:.2f}×" if b else "-" for b in (old, same))
            print(f"| {name} | {policy} | {m['wasted_gpu_hours']:,.0f} ({w['lost_gpu_hours']:,.0f} + "
                  f"{w['checkpoint_gpu_hours']:,.0f}) | {w['per_1000_delivered_gpu_hours']:.2f} | "
                  f"{m['attainment']['fleet']:.1%} / {m['attainment']['min_team']:.1%} | "
                  f"{m['queue_wait_s']['by_kind'].get('debug', {}).get('p90', 0):.0f} s | {m['occupancy']:.1%} | "
                  f"{m['preemptions']:,} ({ratio}) | {s['preempted']} / {s['state_lost']} | "
                  f"{n['given']:,} ({n.get('checkpointed', 0):,} / {n.get('killed_at_deadline', 0):,}) | "
                  f"{m['checkpoint_storage']['peak_gbps']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
