"""What a user submits: the workload specification and its scheduling contract."""

from __future__ import annotations

import msgspec

PRIORITIES = ("low", "normal", "high", "urgent")
#: Higher rank runs first inside a team (priority never competes across teams).
PRIORITY_RANK = {name: rank for rank, name in enumerate(PRIORITIES)}


class WorkloadSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, gc=False):
    """One workload as submitted (also one line of a trace file)."""

    id: str
    submit_s: int
    project: str
    gpu_type: str
    gpus: int
    work_s: int
    min_runtime_s: int = 0
    resumable: bool = False
    user: str = ""
    priority: str = "normal"
    kind: str = "other"
    checkpoint_interval_s: int | None = None
    command: list[str] | None = None


class ContractError(ValueError):
    """A workload that breaks the scheduling contract; ``field`` names the culprit."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def check_contract(spec: WorkloadSpec, max_min_runtime_s: int) -> None:
    """Raise ContractError when a field is outside what the contract allows."""
    if not spec.id:
        raise ContractError("id", "must not be empty")
    for name in ("submit_s", "work_s", "min_runtime_s"):
        if getattr(spec, name) < 0:
            raise ContractError(name, f"must not be negative, got {getattr(spec, name)}")
    if spec.gpus <= 0:
        raise ContractError("gpus", f"must be at least 1, got {spec.gpus}")
    if spec.min_runtime_s > max_min_runtime_s:
        raise ContractError(
            "min_runtime_s",
            f"{spec.min_runtime_s}s is above the cap of {max_min_runtime_s}s "
            "(declare the least runtime that makes progress; checkpoint and resume beyond it)",
        )
    if spec.priority not in PRIORITY_RANK:
        raise ContractError("priority", f"must be one of {', '.join(PRIORITIES)}, got {spec.priority!r}")
    if spec.checkpoint_interval_s is not None and spec.checkpoint_interval_s <= 0:
        raise ContractError("checkpoint_interval_s", f"must be positive, got {spec.checkpoint_interval_s}")
