"""The one-screen text summary that compares policies."""

from __future__ import annotations

from ..durations import format_duration_s


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def summary_rows(metrics_by_policy: dict[str, dict]) -> list[tuple[str, list[str]]]:
    rows: list[tuple[str, list[str]]] = []
    policies = list(metrics_by_policy)
    kinds = sorted({k for m in metrics_by_policy.values() for k in m["queue_wait_s"]["by_kind"]})

    def row(label, fn):
        rows.append((label, [fn(metrics_by_policy[p]) for p in policies]))

    row("occupancy", lambda m: _pct(m["occupancy"]))
    row("unallocated share of delivered", lambda m: _pct(m["unallocated_share"]))
    row("attainment (funded): fleet", lambda m: _pct(m["attainment"]["fleet"]))
    row("attainment (funded): worst team", lambda m: _pct(m["attainment"]["min_team"]))
    row("teams >= 95% of owed (funded)",
        lambda m: f"{m['attainment']['teams_at_or_above_95']}/{m['attainment']['teams']}")
    # every workload counted as owed, unallocated ones included: shown, never a target
    row("all-work attainment (no target)", lambda m: "{} / {}".format(
        _pct(m["attainment_all_work"]["fleet"]), _pct(m["attainment_all_work"]["min_team"])))
    row("queue wait p50 / p90", lambda m: "{} / {}".format(format_duration_s(m["queue_wait_s"]["overall"]["p50"]),
                                                           format_duration_s(m["queue_wait_s"]["overall"]["p90"])))
    for kind in kinds:
        row(f"  {kind} p50 / p90", lambda m, k=kind: (
            "{} / {}".format(format_duration_s(m["queue_wait_s"]["by_kind"][k]["p50"]),
                             format_duration_s(m["queue_wait_s"]["by_kind"][k]["p90"]))
            if k in m["queue_wait_s"]["by_kind"] else "-"))
    row("requeue wait p50 / p90", lambda m: "{} / {}".format(
        format_duration_s(m["queue_wait_s"]["requeue"]["p50"]), format_duration_s(m["queue_wait_s"]["requeue"]["p90"])))
    row("preemptions", lambda m: str(m["preemptions"]))
    row("wasted GPU-hours", lambda m: f"{m['wasted_gpu_hours']:.0f}")
    # its parts (progress lost, checkpoints written on notice), and per 1,000 delivered
    # (metrics of runs before notices have no "waste")
    row("  lost + checkpoint", lambda m: "{:.0f} + {:.0f}".format(m["waste"]["lost_gpu_hours"],
                                                                  m["waste"]["checkpoint_gpu_hours"])
        if "waste" in m else "-")
    row("  per 1,000 delivered GPU-hours", lambda m: f"{m['waste']['per_1000_delivered_gpu_hours']:.2f}"
        if "waste" in m else "-")
    row("notices (checkpointed / killed)", lambda m: "{} ({} / {})".format(
        m["notices"]["given"], m["notices"].get("checkpointed", 0), m["notices"].get("killed_at_deadline", 0))
        if "notices" in m else "-")
    row("sessions preempted / state lost", lambda m: "{} / {}".format(m["sessions"]["preempted"],
                                                                       m["sessions"]["state_lost"])
        if "sessions" in m else "-")
    row("checkpoint storage peak", lambda m: "{:.1f} GB/s{}".format(
        m["checkpoint_storage"]["peak_gbps"],
        f" of {m['checkpoint_storage']['bandwidth_gbps']:g}" if m["checkpoint_storage"]["bandwidth_gbps"] else "")
        if "checkpoint_storage" in m else "-")
    row("drains needing a human", lambda m: f"{m['drains']['needing_human']}/{m['drains']['total']}")
    row("still pending at end", lambda m: str(m["workloads"]["pending_at_end"]))
    row("wall time", lambda m: f"{m['sim']['wall_s']:.2f}s ({m['sim']['events']} events)")
    return rows


def render_summary(name: str, metrics_by_policy: dict[str, dict]) -> str:
    rows = summary_rows(metrics_by_policy)
    policies = list(metrics_by_policy)
    width = max(len(r[0]) for r in rows) + 2
    cols = [max(len(p), *(len(r[1][i]) for r in rows)) + 2 for i, p in enumerate(policies)]
    lines = [f"scenario {name}", "".ljust(width) + "".join(p.rjust(c) for p, c in zip(policies, cols))]
    for label, values in rows:
        lines.append(label.ljust(width) + "".join(v.rjust(c) for v, c in zip(values, cols)))
    return "\n".join(lines)
