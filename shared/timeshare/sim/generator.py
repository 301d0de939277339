"""Synthetic workloads from a scenario's ``[generator]`` table (seeded, deterministic).

Model: the offered load (GPU-time asked for / pool capacity over the run) is split between
workload classes (``load_share``) and, inside a class, between leaf teams in proportion to
their fraction times a per-team activity factor (log-normal with ``team_spread``; some teams
ask for far more than their share, some for less). Each (team, class) submits as a Poisson
process, optionally with a day/night cycle (``diurnal``), GPU counts drawn from ``gpus``
(a list, or a table of weights) and work log-uniform in ``work = [min, max]``.

``max_share_multiple`` caps a team's requests at that multiple of its share of the pool
(teams size their gangs to their budget; the smallest size stays allowed).

``min_runtime`` is ``"work"`` (the workload's own length, capped), a duration, or a range
``[min, max]`` (uniform, capped by the work).

Preemption with notice (none by default): ``checkpoint_on_notice`` is a duration, or a range
``[min, max]`` spread by GPU count (the class's smallest gang gets min, its largest max,
log-linear between: larger gangs write larger checkpoints); ``checkpoint_gb_per_gpu`` sizes the
checkpoint with the GPUs; ``suspends_on_notice`` marks sessions that save their state and resume
it. They draw no random numbers, so a scenario's workloads stay the same without them.
"""

from __future__ import annotations

import itertools
import math
import random
from bisect import bisect
from typing import Any, Callable

from ..cluster import Cluster
from ..config import PolicyConfig
from ..durations import parse_duration_s
from ..tree import AllocationTree
from ..workload import PRIORITIES, WorkloadSpec


class GeneratorError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


_CLASS_KEYS = {"kind", "load_share", "gpus", "work", "min_runtime", "resumable", "checkpoint_interval",
               "priority", "diurnal", "gpu_type", "teams", "checkpoint_on_notice", "checkpoint_gb_per_gpu",
               "suspends_on_notice"}


def _notice_of(value: Any, field: str, max_notice_s: int) -> Callable[[int, int, int], int] | None:
    """``checkpoint_on_notice`` -> (gpus, smallest, largest) -> seconds (None: no notice)."""
    if value is None:
        return None
    try:
        if isinstance(value, list):
            if len(value) != 2:
                raise ValueError("expected [min, max]")
            lo_s, hi_s = (parse_duration_s(x) for x in value)
        else:
            lo_s = hi_s = parse_duration_s(value)
    except (TypeError, ValueError) as exc:
        raise GeneratorError(field, f"expected a duration or [min, max] durations ({exc})") from None
    if not 0 < lo_s <= hi_s:
        raise GeneratorError(field, "needs 0 < min <= max")
    if hi_s > max_notice_s:
        raise GeneratorError(field, f"{hi_s}s is above the policy's max_notice of {max_notice_s}s")

    def notice_s(gpus: int, smallest: int, largest: int) -> int:
        if largest <= smallest:
            return hi_s
        x = math.log(gpus / smallest) / math.log(largest / smallest)
        return int(round(lo_s + (hi_s - lo_s) * x))

    return notice_s


def _weights(value: Any, field: str, parse: Callable[[Any], Any] | None = None) -> tuple[list, list[float]]:
    if isinstance(value, dict):
        items = sorted(value.items())
        keys = [parse(k) if parse else k for k, _ in items]
        weights = [float(w) for _, w in items]
    elif isinstance(value, list) and value:
        keys, weights = list(value), [1.0] * len(value)
    else:
        raise GeneratorError(field, f"expected a list or a table of weights, got {value!r}")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise GeneratorError(field, "weights must be non-negative and not all zero")
    return keys, weights


def generate(table: dict, tree: AllocationTree, cluster: Cluster, policy: PolicyConfig, duration_s: int,
             seed: int) -> list[WorkloadSpec]:
    unknown = set(table) - {"offered_load", "team_spread", "classes", "arrival_horizon", "max_share_multiple"}
    if unknown:
        raise GeneratorError(sorted(unknown)[0], "unknown generator setting")
    load = table.get("offered_load", 2.0)
    if not isinstance(load, (int, float)) or load <= 0:
        raise GeneratorError("offered_load", f"must be a positive number, got {load!r}")
    spread = float(table.get("team_spread", 0.5))
    max_multiple = table.get("max_share_multiple")
    if max_multiple is not None and (not isinstance(max_multiple, (int, float)) or max_multiple <= 0):
        raise GeneratorError("max_share_multiple", f"must be a positive number, got {max_multiple!r}")
    horizon_s = parse_duration_s(table.get("arrival_horizon", duration_s))
    classes = table.get("classes")
    if not classes:
        raise GeneratorError("classes", "at least one [[generator.classes]] is required")
    rng = random.Random(seed)
    leaves = tree.leaves
    activity = {leaf: rng.lognormvariate(0.0, spread) for leaf in leaves}
    default_type = next(iter(cluster.pools))
    out: list[WorkloadSpec] = []
    total_share = sum(float(c.get("load_share", 0)) for c in classes)
    if total_share <= 0:
        raise GeneratorError("classes", "load_share of the classes must add up to more than 0")
    for ci, cls in enumerate(classes):
        where = f"classes[{ci}]"
        bad = set(cls) - _CLASS_KEYS
        if bad:
            raise GeneratorError(f"{where}.{sorted(bad)[0]}", "unknown class setting")
        kind = str(cls.get("kind", f"class{ci}"))
        gpu_type = cls.get("gpu_type", default_type)
        if gpu_type not in cluster.pools:
            raise GeneratorError(f"{where}.gpu_type", f"no pool {gpu_type!r}")
        pool = cluster.pools[gpu_type]
        gpus_list, gpus_w = _weights(cls.get("gpus", [1]), f"{where}.gpus", int)
        try:
            lo_s, hi_s = (parse_duration_s(x) for x in cls["work"])
        except (KeyError, TypeError, ValueError) as exc:
            raise GeneratorError(f"{where}.work", f"expected [min, max] durations ({exc})") from None
        if not 0 < lo_s <= hi_s:
            raise GeneratorError(f"{where}.work", "needs 0 < min <= max")
        mean_work_s = (hi_s - lo_s) / math.log(hi_s / lo_s) if hi_s > lo_s else lo_s
        class_gpu_s = load * pool.total_gpus * horizon_s * float(cls.get("load_share", 0)) / total_share
        mrt = cls.get("min_runtime", 0)
        # parsed once per class, not per workload (the same values, no random numbers drawn)
        mrt_range_s = tuple(parse_duration_s(x) for x in mrt) if isinstance(mrt, list) else None
        mrt_s = parse_duration_s(mrt) if mrt != "work" and mrt_range_s is None else 0
        prio_keys, prio_w = _weights(cls.get("priority", {"normal": 1}), f"{where}.priority")
        prio_cum_w = list(itertools.accumulate(prio_w))  # (as team_cum_w below)
        prio_total, prio_hi = prio_cum_w[-1] + 0.0, len(prio_keys) - 1
        for p in prio_keys:
            if p not in PRIORITIES:
                raise GeneratorError(f"{where}.priority", f"unknown priority {p!r}")
        ckpt = cls.get("checkpoint_interval")
        ckpt_s = parse_duration_s(ckpt) if ckpt is not None else None
        resumable = bool(cls.get("resumable", False))
        notice_of = _notice_of(cls.get("checkpoint_on_notice"), f"{where}.checkpoint_on_notice", policy.max_notice_s)
        gb_per_gpu = cls.get("checkpoint_gb_per_gpu")
        if gb_per_gpu is not None and (isinstance(gb_per_gpu, bool) or not isinstance(gb_per_gpu, (int, float))
                                       or gb_per_gpu < 0):
            raise GeneratorError(f"{where}.checkpoint_gb_per_gpu", f"must be a non-negative number, got {gb_per_gpu!r}")
        suspends = cls.get("suspends_on_notice")
        if suspends is not None and not isinstance(suspends, bool):
            raise GeneratorError(f"{where}.suspends_on_notice", f"must be true or false, got {suspends!r}")
        notice_fields: dict[int, dict[str, Any]] = {}
        for g in gpus_list:
            f: dict[str, Any] = {}
            if notice_of is not None:
                f["checkpoint_on_notice_s"] = notice_of(g, min(gpus_list), max(gpus_list))
            if gb_per_gpu is not None:
                f["checkpoint_gb"] = float(gb_per_gpu) * g
            if suspends is not None:
                f["suspends_on_notice"] = suspends
            notice_fields[g] = f
        diurnal = float(cls.get("diurnal", 0.0))
        teams = [t for t in leaves if t in cls.get("teams", leaves)]
        weights = {t: tree.nodes[t].fraction * activity[t] for t in teams}
        total_w = sum(weights.values()) or 1.0
        for team in teams:
            team_gpus, team_w = gpus_list, gpus_w
            if max_multiple is not None:
                cap = max_multiple * tree.nodes[team].fraction * pool.total_gpus
                allowed = [(g, w) for g, w in zip(gpus_list, gpus_w) if g <= cap] or [min(zip(gpus_list, gpus_w))]
                team_gpus, team_w = [g for g, _ in allowed], [w for _, w in allowed]
            team_mean_gpus = sum(g * w for g, w in zip(team_gpus, team_w)) / sum(team_w)
            # rng.choices(population, weights)[0] as random.py draws it (one random(), the same
            # bisection), with the sums it makes on every call made once per team
            team_cum_w = list(itertools.accumulate(team_w))
            team_total, team_hi = team_cum_w[-1] + 0.0, len(team_gpus) - 1
            short = team.replace("/", "-")
            team_gpu_s = class_gpu_s * weights[team] / total_w
            rate_per_s = team_gpu_s / (team_mean_gpus * mean_work_s) / horizon_s
            if rate_per_s <= 0:
                continue
            # one stream per (class, team): a shorter run sees a prefix of a longer one
            rng = random.Random(f"{seed}:{kind}:{team}")
            t = 0.0
            n = 0
            peak = 1.0 + diurnal
            while True:
                t += rng.expovariate(rate_per_s * peak)
                if t >= horizon_s:
                    break
                # thinning: fewer submissions at night when diurnal > 0
                if diurnal and rng.random() * peak > 1.0 + diurnal * math.sin(2 * math.pi * (t / 86400 - 0.25)):
                    continue
                gpus = team_gpus[bisect(team_cum_w, rng.random() * team_total, 0, team_hi)]
                work_s = int(round(math.exp(rng.uniform(math.log(lo_s), math.log(hi_s))))) if hi_s > lo_s else lo_s
                if mrt == "work":
                    min_rt = min(work_s, policy.max_min_runtime_s)
                elif mrt_range_s is not None:
                    a, b = mrt_range_s
                    min_rt = min(int(rng.uniform(a, b)), work_s, policy.max_min_runtime_s)
                else:
                    min_rt = min(mrt_s, work_s, policy.max_min_runtime_s)
                priority = prio_keys[bisect(prio_cum_w, rng.random() * prio_total, 0, prio_hi)]
                out.append(WorkloadSpec(
                    id=f"{short}-{kind}-{n}", submit_s=int(t), project=team, user=f"{short}-u{rng.randrange(10)}",
                    gpu_type=gpu_type, gpus=gpus, work_s=work_s, min_runtime_s=min_rt, resumable=resumable,
                    priority=priority, kind=kind, checkpoint_interval_s=ckpt_s, **notice_fields[gpus]))
                n += 1
    out.sort(key=lambda w: (w.submit_s, w.id))
    return out
