"""Scenario files (TOML): pools, allocation tree, policy settings, node events, workloads.

Errors name the file, the line (found by looking the key up in the text) and the field, and
are raised before anything runs.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ..cluster import Cluster, PoolSpec
from ..config import UNALLOCATED_PREEMPTION, PolicyConfig
from ..durations import parse_duration_s
from ..tree import AllocationTree, TreeError
from ..workload import WorkloadSpec
from .errors import InputError
from .trace import load_trace, validate_trace


@dataclass(frozen=True)
class NodeEvent:
    at_s: int
    node: str
    kind: str  # "unhealthy" | "failed"
    repair_s: int
    reason: str = ""


@dataclass
class Scenario:
    name: str
    duration_s: int
    seed: int
    policy: PolicyConfig
    pools: list[PoolSpec]
    allocations: dict[str, float]
    node_events: list[NodeEvent]
    workloads: list[WorkloadSpec]
    source: str = ""
    generator: dict = field(default_factory=dict)
    #: [cluster] checkpoint_bandwidth_gbps: GB/s that checkpoints written on notice share
    #: (None: unlimited)
    checkpoint_bandwidth_gbps: float | None = None

    def tree(self) -> AllocationTree:
        return AllocationTree.from_shares(self.allocations)

    def cluster(self) -> Cluster:
        return Cluster(self.pools, self.checkpoint_bandwidth_gbps)


_POLICY_NUMBERS = ("preemption_hysteresis", "unallocated_hysteresis", "unallocated_headroom", "catch_up")
_POLICY_DURATIONS = {"lookback_window": "lookback_window_s", "max_min_runtime": "max_min_runtime_s",
                     "max_notice": "max_notice_s",
                     "resubmit_delay": "resubmit_delay_s", "drain_human_after": "drain_human_after_s"}


class _Reader:
    """Looks fields up and turns mistakes into InputError with a line number."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.lines = text.splitlines()

    def line_of(self, key: str, after: int = 0) -> int | None:
        pattern = re.compile(rf'^\s*"?{re.escape(key)}"?\s*=')
        for i in range(after, len(self.lines)):
            if pattern.match(self.lines[i]):
                return i + 1
        for i, line in enumerate(self.lines):
            if key in line:
                return i + 1
        return None

    def error(self, field: str, message: str, key: str | None = None) -> InputError:
        return InputError(self.path, self.line_of(key or field.rsplit(".", 1)[-1].split("[")[0]), field, message)

    def duration(self, table: dict, key: str, where: str, default: Any = None) -> int:
        if key not in table:
            if default is None:
                raise self.error(f"{where}{key}", "is required", key)
            return default
        try:
            return parse_duration_s(table[key])
        except ValueError as exc:
            raise self.error(f"{where}{key}", str(exc), key) from None


def load_scenario(path: str | Path, overrides: dict[str, str] | None = None, text: str | None = None) -> Scenario:
    """Read and validate a scenario file; ``overrides`` set dotted keys (``policy.lookback_window``).
    ``text``: the file's contents when the caller has them (``path`` then names it in errors
    and places a trace)."""
    path = Path(path)
    if text is None:
        text = path.read_text()
    reader = _Reader(str(path), text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(str(path), getattr(exc, "lineno", None), None, f"not valid TOML: {exc}") from None
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    return scenario_from_dict(data, reader, path.parent)


def _set_dotted(data: dict, dotted: str, value: Any) -> None:
    """Set ``dotted`` (``policy.lookback_window``, ``pools.0.nodes``: a number indexes an array
    of tables) to ``value``; a path that leads nowhere is an InputError naming the key."""
    parts = dotted.split(".")
    if len(parts) == 1 and parts[0] not in ("name", "duration", "seed"):
        parts = ["policy", parts[0]]  # sweep shorthand: lookback_window=3d
    if not all(parts):
        raise InputError("--set", None, dotted, "expected a dotted key such as policy.lookback_window or pools.0.nodes")
    target: Any = data
    for depth, p in enumerate(parts[:-1]):
        where = ".".join(parts[: depth + 1])
        if isinstance(target, list):
            if not p.isdigit() or int(p) >= len(target):
                raise InputError("--set", None, dotted, f"{where}: there are {len(target)} of them "
                                 f"(give an index from 0 to {len(target) - 1})")
            target = target[int(p)]
        elif isinstance(target, dict):
            target = target.setdefault(p, {})
        else:
            raise InputError("--set", None, dotted, f"{'.'.join(parts[:depth])} is a value, not a table")
    if not isinstance(target, dict):
        raise InputError("--set", None, dotted, f"{'.'.join(parts[:-1])} is not a table of settings")
    if isinstance(value, str):
        try:
            value = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            pass  # keep as string ("3d")
    target[parts[-1]] = value


def scenario_from_dict(data: dict, reader: _Reader, base: Path) -> Scenario:
    known = {"name", "duration", "seed", "policy", "pools", "allocations", "node_events", "trace", "generator", "scale",
             "cluster"}
    for key in data:
        if key not in known:
            raise reader.error(key, f"unknown setting (expected one of {', '.join(sorted(known))})")
    name = str(data.get("name", Path(reader.path).stem))
    duration_s = reader.duration(data, "duration", "")
    seed = data.get("seed", 0)
    if not isinstance(seed, int):
        raise reader.error("seed", f"must be an integer, got {seed!r}")

    policy_table = dict(data.get("policy", {}))
    kwargs: dict[str, Any] = {}
    for key, value in policy_table.items():
        if key in _POLICY_DURATIONS:
            kwargs[_POLICY_DURATIONS[key]] = reader.duration(policy_table, key, "policy.")
        elif key in _POLICY_NUMBERS:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise reader.error(f"policy.{key}", f"must be a non-negative number, got {value!r}")
            kwargs[key] = float(value)
        elif key in ("gang_reservations", "preemption_notice"):
            if not isinstance(value, bool):
                raise reader.error(f"policy.{key}", f"must be true or false, got {value!r}")
            kwargs[key] = value
        elif key == "unallocated_preemption":
            if value not in UNALLOCATED_PREEMPTION:
                raise reader.error(f"policy.{key}", f"must be one of {', '.join(UNALLOCATED_PREEMPTION)}, got {value!r}")
            kwargs[key] = value
        else:
            raise reader.error(f"policy.{key}", "unknown policy setting "
                               f"(expected {', '.join(sorted([*_POLICY_DURATIONS, *_POLICY_NUMBERS, 'unallocated_preemption', 'gang_reservations', 'preemption_notice']))})")
    try:
        policy = PolicyConfig(**kwargs).validate()
    except ValueError as exc:
        raise reader.error("policy", str(exc)) from None

    cluster_table = data.get("cluster", {})
    if not isinstance(cluster_table, dict):
        raise reader.error("cluster", "must be a table: [cluster] checkpoint_bandwidth_gbps = 20", "[cluster]")
    for key in cluster_table:
        if key != "checkpoint_bandwidth_gbps":
            raise reader.error(f"cluster.{key}", "unknown cluster setting (expected checkpoint_bandwidth_gbps)", key)
    bandwidth = cluster_table.get("checkpoint_bandwidth_gbps")
    if bandwidth is not None and (isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float))
                                  or bandwidth <= 0):
        raise reader.error("cluster.checkpoint_bandwidth_gbps",
                           f"must be a positive number of GB/s (or absent: unlimited), got {bandwidth!r}",
                           "checkpoint_bandwidth_gbps")

    scale = data.get("scale", {})
    if not isinstance(scale, dict):
        raise reader.error("scale", "must be a table: [scale] pools = 16, projects = 1000", "[scale]")
    for key in scale:
        if key not in ("pools", "projects"):
            raise reader.error(f"scale.{key}", "unknown scale setting (expected pools, projects)", key)
        if isinstance(scale[key], bool) or not isinstance(scale[key], int) or scale[key] <= 0:
            raise reader.error(f"scale.{key}", f"must be a positive integer, got {scale[key]!r}", key)
    pool_factor = scale.get("pools", 1)

    pools = []
    raw_pools = data.get("pools")
    if not raw_pools:
        raise reader.error("pools", "at least one [[pools]] table is required", "[[pools]]")
    for i, p in enumerate(raw_pools):
        where = f"pools[{i}]."
        for key in ("gpu_type", "nodes", "gpus_per_node"):
            if key not in p:
                raise reader.error(f"{where}{key}", "is required", "[[pools]]")
        for key in ("nodes", "gpus_per_node", "rack_size"):
            if key in p and (not isinstance(p[key], int) or p[key] <= 0):
                raise reader.error(f"{where}{key}", f"must be a positive integer, got {p[key]!r}", key)
        unknown = set(p) - {"gpu_type", "nodes", "gpus_per_node", "rack_size"}
        if unknown:
            raise reader.error(f"{where}{sorted(unknown)[0]}", "unknown pool setting", sorted(unknown)[0])
        pools.append(PoolSpec(str(p["gpu_type"]), p["nodes"] * pool_factor, p["gpus_per_node"], p.get("rack_size")))
    try:
        cluster = Cluster(pools)
    except ValueError as exc:
        raise reader.error("pools", str(exc), "[[pools]]") from None

    allocations = data.get("allocations")
    if not allocations:
        raise reader.error("allocations", "an [allocations] table with at least one path = share is required",
                           "[allocations]")
    try:
        tree = AllocationTree.from_shares(dict(allocations))
    except TreeError as exc:
        raise InputError(reader.path, reader.line_of(exc.path), f"allocations.{exc.path}", exc.message) from None
    if "projects" in scale and "trace" in data:
        raise reader.error("scale.projects", "splits the generator's teams; a trace names its own projects", "projects")
    if scale.get("projects", 0) > len(tree.leaves):
        allocations = scaled_projects(tree, scale["projects"])
        tree = AllocationTree.from_shares(allocations)

    node_events = []
    for i, ne in enumerate(data.get("node_events", [])):
        where = f"node_events[{i}]."
        for key in ("at", "node", "kind"):
            if key not in ne:
                raise reader.error(f"{where}{key}", "is required", "[[node_events]]")
        if ne["node"] not in cluster.nodes_by_name:
            raise reader.error(f"{where}node", f"unknown node {ne['node']!r} (nodes are named <gpu_type>-<index "
                               "from 000>)", "node")
        if ne["kind"] not in ("unhealthy", "failed"):
            raise reader.error(f"{where}kind", f"must be 'unhealthy' or 'failed', got {ne['kind']!r}", "kind")
        node_events.append(NodeEvent(reader.duration(ne, "at", where), ne["node"], ne["kind"],
                                     reader.duration(ne, "repair", where, default=6 * 3600),
                                     str(ne.get("reason", ""))))
    node_events.sort(key=lambda e: (e.at_s, e.node))

    generator = data.get("generator")
    trace = data.get("trace")
    if (generator is None) == (trace is None):
        raise reader.error("trace", "give exactly one of [trace] (path = ...) or [generator]", "[trace]")
    if trace is not None:
        if "path" not in trace:
            raise reader.error("trace.path", "is required", "[trace]")
        trace_path = (base / trace["path"]).resolve()
        if not trace_path.exists():
            raise reader.error("trace.path", f"no such file: {trace_path}", "path")
        workloads, linenos = load_trace(trace_path)
        validate_trace(workloads, tree, cluster, policy.max_min_runtime_s, str(trace_path), linenos,
                       policy.max_notice_s)
        source = str(trace_path)
    else:
        assert generator is not None  # exactly one of the two, checked above
        from .generator import GeneratorError, generate

        try:
            workloads = generate(generator, tree, cluster, policy, duration_s, seed)
        except GeneratorError as exc:
            raise reader.error(f"generator.{exc.field}", exc.message, exc.field.split(".")[-1].split("[")[0]) from None
        validate_trace(workloads, tree, cluster, policy.max_min_runtime_s, f"{reader.path} [generator]",
                       max_notice_s=policy.max_notice_s)
        source = "generator"
    workloads.sort(key=lambda w: (w.submit_s, w.id))
    return Scenario(name=name, duration_s=duration_s, seed=seed, policy=policy, pools=pools,
                    allocations=dict(allocations), node_events=node_events, workloads=workloads,
                    source=source, generator=dict(generator or {}),
                    checkpoint_bandwidth_gbps=float(bandwidth) if bandwidth is not None else None)


def scaled_projects(tree: AllocationTree, projects: int) -> dict[str, float]:
    """The tree's shares with every leaf split into equal-share projects ``p000``, ``p001``...
    so that there are at least ``projects`` leaves (``[scale] projects``): the same teams and
    fractions, ``projects / leaves`` times as many queues."""
    per_leaf = -(-projects // len(tree.leaves))
    width = len(str(per_leaf - 1))
    shares = tree.shares()
    for leaf in tree.leaves:
        for k in range(per_leaf):
            shares[f"{leaf}/p{k:0{width}d}"] = 1.0
    return shares


def scenario_to_toml_policy(policy: PolicyConfig) -> dict:
    return msgspec.structs.asdict(policy)
