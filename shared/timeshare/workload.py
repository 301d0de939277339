"""What a user submits: the workload specification and its scheduling contract."""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

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
    # The notice part of the contract. UNSET (not 0/False) by default so that a workload that
    # declares none encodes byte for byte as before notices existed (logs, traces, parity).
    #: seconds it needs to write a checkpoint after SIGTERM (0 or absent: no notice; the
    #: policy's max_notice_s caps it)
    checkpoint_on_notice_s: int | UnsetType = UNSET
    #: the checkpoint's size in GB (shares the cluster's checkpoint bandwidth with others)
    checkpoint_gb: float | UnsetType = UNSET
    #: an interactive session that saves its state on notice and resumes it elsewhere
    suspends_on_notice: bool | UnsetType = UNSET

    @property
    def notice_s(self) -> int:
        """The notice it asks for (0: none)."""
        return self.checkpoint_on_notice_s if self.checkpoint_on_notice_s is not UNSET else 0

    @property
    def checkpoint_size_gb(self) -> float:
        return self.checkpoint_gb if self.checkpoint_gb is not UNSET else 0.0

    @property
    def suspends(self) -> bool:
        return self.suspends_on_notice is True


class ContractError(ValueError):
    """A workload that breaks the scheduling contract; ``field`` names the culprit."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


#: the default cap on a declared checkpoint-on-notice time (PolicyConfig.max_notice_s)
MAX_NOTICE_S = 300


def check_contract(spec: WorkloadSpec, max_min_runtime_s: int, max_notice_s: int = MAX_NOTICE_S) -> None:
    """Raise ContractError when a field is outside what the contract allows."""
    if not spec.id:
        raise ContractError("id", "must not be empty")
    if spec.submit_s < 0 or spec.work_s < 0 or spec.min_runtime_s < 0:  # (every submission passes here)
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
    notice_s = spec.notice_s
    if notice_s < 0:
        raise ContractError("checkpoint_on_notice_s", f"must not be negative, got {notice_s}")
    if notice_s > max_notice_s:
        raise ContractError(
            "checkpoint_on_notice_s",
            f"{notice_s}s is above the policy's max_notice of {max_notice_s}s "
            "(checkpoint faster, or checkpoint periodically and declare no notice)",
        )
    if spec.checkpoint_size_gb < 0:
        raise ContractError("checkpoint_gb", f"must not be negative, got {spec.checkpoint_size_gb}")
