"""Trace files (JSON Lines, one workload per line) -> validated workload specs."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import msgspec

from ..cluster import Cluster, PlacementError
from ..tree import AllocationTree, TreeError
from ..workload import MAX_NOTICE_S, ContractError, WorkloadSpec, check_contract
from .errors import InputError

_decoder = msgspec.json.Decoder(WorkloadSpec)


def parse_trace_lines(lines: Iterable[str | bytes], file: str) -> tuple[list[WorkloadSpec], list[int]]:
    """Decode every line; raise InputError naming the file, line and field of the first error.

    Returns the specs and the line number of each."""
    out = []
    linenos = []
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            out.append(_decoder.decode(raw))
            linenos.append(lineno)
        except msgspec.ValidationError as exc:
            text = str(exc)
            field = text.split("at `$.", 1)[1].rstrip("`") if "at `$." in text else None
            if field is None and ("missing required field" in text or "unknown field" in text):
                field = text.split("`")[1]
            raise InputError(file, lineno, field, text) from None
        except msgspec.DecodeError as exc:
            raise InputError(file, lineno, None, f"malformed JSON: {exc}") from None
    return out, linenos


def load_trace(path: Path) -> tuple[list[WorkloadSpec], list[int]]:
    with open(path, "rb") as fh:
        return parse_trace_lines(fh, str(path))


def validate_trace(specs: list[WorkloadSpec], tree: AllocationTree, cluster: Cluster, max_min_runtime_s: int,
                   file: str, linenos: list[int] | None = None, max_notice_s: int = MAX_NOTICE_S) -> None:
    """Check every workload against the tree, the pools and the contract before anything runs."""
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        line = linenos[i] if linenos else i + 1
        try:
            check_contract(spec, max_min_runtime_s, max_notice_s)
        except ContractError as exc:
            raise InputError(file, line, exc.field, exc.message) from None
        try:
            tree.require_leaf(spec.project)
        except TreeError as exc:
            # the project's name in the message: "project: 'lab/nope': unknown allocation"
            raise InputError(file, line, "project", f"{spec.project!r}: {exc.message}" if exc.path == spec.project
                             else str(exc)) from None
        try:
            cluster.pool(spec.gpu_type).check_request(spec.gpus)
        except PlacementError as exc:
            field = "gpu_type" if spec.gpu_type not in cluster.pools else "gpus"
            raise InputError(file, line, field, str(exc)) from None
        if spec.id in seen:
            raise InputError(file, line, "id", f"duplicate workload id {spec.id!r}")
        seen.add(spec.id)
