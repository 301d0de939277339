"""Time series of a run: GPU-seconds per bin, what a team was owed, its usage ratio.

Everything is built from piecewise-constant rates (GPUs held, GPUs asked for) given as rate
changes ``(t_s, delta)``. Their integral is piecewise linear, so any bin or window is two
lookups into the cumulative integral: exact, vectorised, no per-hour loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .runlog import RunLog

HOUR_S = 3600


def cumulative(t_s: np.ndarray, delta: np.ndarray, at_s: np.ndarray) -> np.ndarray:
    """Integral from 0 to each ``at_s`` of the rate that changes by ``delta`` at ``t_s``."""
    if len(t_s) == 0:
        return np.zeros(len(at_s))
    order = np.argsort(t_s, kind="stable")
    t = t_s[order]
    rate = np.cumsum(delta[order])  # rate from t[i] on
    area = np.concatenate(([0.0], np.cumsum(rate[:-1] * np.diff(t))))  # integral up to t[i]
    j = np.searchsorted(t, at_s, side="right") - 1
    out = np.zeros(len(at_s))
    ok = j >= 0
    out[ok] = area[j[ok]] + rate[j[ok]] * (at_s[ok] - t[j[ok]])
    return out


def binned(t_s: np.ndarray, delta: np.ndarray, edges_s: np.ndarray) -> np.ndarray:
    """GPU-seconds per bin between consecutive ``edges_s``."""
    return np.diff(cumulative(t_s, delta, edges_s))


def hour_edges(end_s: float) -> np.ndarray:
    """Hour boundaries from 0 to the end of the run; the last bin stops at ``end_s``."""
    edges = np.arange(0.0, end_s + HOUR_S, HOUR_S)
    return np.minimum(edges, end_s)


def _segments_as_rates(log: RunLog, mask: np.ndarray, start_s: np.ndarray | None = None):
    t0 = log.seg_t0_s[mask] if start_s is None else start_s[mask]
    g = log.seg_gpus[mask].astype(np.float64)
    return np.concatenate((t0, log.seg_t1_s[mask])), np.concatenate((g, -g))


@dataclass
class TeamHours:
    """Hourly GPU-seconds per team (rows = teams, columns = hours of the run).

    Funded work is a workload with a minimum runtime > 0 on a team with a budget: ``owed``
    and ``funded`` count it alone (what attainment counts), ``owed_all_work`` every workload."""

    edges_s: np.ndarray
    funded: np.ndarray  # delivered to funded work
    other: np.ndarray  # delivered to the rest (min runtime 0, or no budget): owed to no one
    owed: np.ndarray  # owed to funded work
    owed_all_work: np.ndarray  # owed counting every workload (shown, never a target)
    fraction: np.ndarray  # per team

    @property
    def delivered(self) -> np.ndarray:
        return self.funded + self.other


def team_hours(log: RunLog, fractions: dict[str, float], pool_gpus: dict[str, int]) -> TeamHours:
    """Delivered (funded / other) and owed GPU-s per team and hour.

    owed(team, hour) = sum over pools of min(fraction x pool GPUs x 1 h, GPU-s its funded work
    asked for in that hour, pending or running) -- the definition metrics.py uses for
    attainment; ``owed_all_work`` the same with every workload asking."""
    edges = hour_edges(log.end_s)
    n_t, n_h = len(log.teams), len(edges) - 1
    funded = np.zeros((n_t, n_h))
    other = np.zeros((n_t, n_h))
    owed = np.zeros((n_t, n_h))
    owed_all = np.zeros((n_t, n_h))
    for ti, team in enumerate(log.teams):
        budgeted = fractions[team] > 0
        mine = log.seg_team == ti
        is_funded = log.seg_min_runtime if budgeted else np.zeros(len(log.seg_team), bool)
        t, d = _segments_as_rates(log, mine & is_funded)
        funded[ti] = binned(t, d, edges)
        t, d = _segments_as_rates(log, mine & ~is_funded)
        other[ti] = binned(t, d, edges)
        for pi, pool in enumerate(log.pools):
            entitled = fractions[team] * pool_gpus[pool] * HOUR_S
            m = (log.demand_team == ti) & (log.demand_pool == pi)
            owed_all[ti] += np.minimum(entitled, binned(log.demand_t_s[m], log.demand_delta[m], edges))
            if budgeted:
                m &= log.demand_min_runtime
                owed[ti] += np.minimum(entitled, binned(log.demand_t_s[m], log.demand_delta[m], edges))
    return TeamHours(edges, funded, other, owed, owed_all, np.array([fractions[t] for t in log.teams]))


def attainment(delivered_gpu_s: np.ndarray, owed_gpu_s: np.ndarray) -> float | None:
    """sum of min(delivered, owed) / sum of owed, hour by hour (None when nothing was owed)."""
    total = owed_gpu_s.sum()
    return float(np.minimum(delivered_gpu_s, owed_gpu_s).sum() / total) if total > 0 else None


def usage_ratio(log: RunLog, team_mask_fn, fraction: float, total_gpus: int, window_s: float,
                at_s: np.ndarray) -> np.ndarray:
    """Allocated GPU-s in the lookback window / (fraction x GPUs x window), at each ``at_s``.

    ``team_mask_fn(seg_team)`` picks the segments of a team or of a whole program."""
    if fraction <= 0:
        return np.full(len(at_s), np.nan)
    mask = team_mask_fn(log.seg_team) & log.seg_allocated
    t, d = _segments_as_rates(log, mask)
    used = cumulative(t, d, at_s) - cumulative(t, d, np.maximum(at_s - window_s, 0.0))
    return used / (fraction * total_gpus * window_s)


def rebin(hourly: np.ndarray, hours_per_bin: int) -> np.ndarray:
    """Sum consecutive hourly columns into bins of ``hours_per_bin`` (the last may be short)."""
    n = hourly.shape[-1]
    starts = np.arange(0, n, hours_per_bin)
    return np.add.reduceat(hourly, starts, axis=-1) if n else hourly


def count_per_bin(t_s: np.ndarray, edges_s: np.ndarray) -> np.ndarray:
    counts, _ = np.histogram(t_s, bins=edges_s)
    return counts
