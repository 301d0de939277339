"""Policy settings (the scenario's [policy] table and the services' configuration)."""

from __future__ import annotations

import msgspec

UNALLOCATED_PREEMPTION = ("any", "fair")


class PolicyConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    #: the cap on a workload's declared checkpoint_on_notice_s (the notice a victim is given
    #: before its GPUs go to the preemptor; Slurm's GraceTime, Kubernetes' grace period)
    max_notice_s: int = 300
    #: whether preemption gives a victim that declared checkpoint_on_notice_s its notice
    #: (off: every preemption ends the victim at once, as before notices existed)
    preemption_notice: bool = True
    #: how far back usage counts toward a team's ratio
    lookback_window_s: int = 7 * 86400
    #: the cap on a workload's declared minimum runtime (Ai2 chose 8 h)
    max_min_runtime_s: int = 8 * 3600
    #: a pending workload preempts allocated work only when, where their paths part, the
    #: victim's subtree runs above its due share and above the requester's fill (counting the
    #: request) by more than this (0.05 = 5% of a due share), so two teams near parity do not
    #: take GPUs back and forth
    preemption_hysteresis: float = 0.05
    #: an unallocated request takes unallocated work from another subtree only when that one
    #: runs more (all GPUs / due share) than the requester would by more than this: free
    #: capacity is shared fairly without trading GPUs back and forth (measured on the built-in
    #: scenario: 0.05 wasted 40% more GPU-hours to preemption for +0.4% attainment)
    unallocated_hysteresis: float = 0.25
    #: which unallocated work an allocated request beyond its due share may preempt:
    #: "any" (the contract: unallocated time is never protected; debug work starts at once)
    #: or "fair" (only its own team's, that of subtrees running more than it would by the
    #: unallocated hysteresis, or any while it stays within its due share plus that
    #: hysteresis at every level): teams that reach their share through unallocated work keep
    #: it, and funded work beyond a team's share waits longer (docs/records/2026-11-measurements.md, "What closing the all-work gap costs")
    unallocated_preemption: str = "any"
    #: the part of each pool that unallocated work leaves free (0.01 = 1% of its GPUs, rounded
    #: down): funded work that arrives starts there without preempting anyone. Unallocated work
    #: does not start where it would bring the pool's free GPUs below it (it may still take
    #: another subtree's unallocated work); GPUs freed by ends refill it. The cost is idle GPUs
    #: (at most this part of the pool); the gain, fewer restarts of unallocated work, each of
    #: which loses the progress since its last checkpoint. The default, 2%, is the idle part of
    #: a cluster run at the 98% occupancy the Ai2 trial reported before and after
    #: (docs/records/2026-12-01-headroom.md measures 0 to 2% on the built-in month)
    unallocated_headroom: float = 0.02
    #: how strongly the window's memory moves the share due now: due = share x (1 + catch_up x
    #: (1 - usage ratio)); 0 orders by the instantaneous share alone
    catch_up: float = 1.0
    #: whether the most deserving entitled gang of each pool holds a reservation (reservation.py):
    #: off only to measure what reservations buy (examples/large-gangs sweeps it)
    gang_reservations: bool = True
    #: simulator: after a non-resumable workload is preempted, its user resubmits it after this
    resubmit_delay_s: int = 600
    #: baseline: a drain that cannot finish within this needs a human (defaults to the cap)
    drain_human_after_s: int | None = None

    def validate(self) -> "PolicyConfig":
        if self.lookback_window_s <= 0:
            raise ValueError("lookback_window must be positive")
        if self.max_min_runtime_s < 0:
            raise ValueError("max_min_runtime must not be negative")
        if self.max_notice_s < 0:
            raise ValueError("max_notice must not be negative")
        if self.preemption_hysteresis < 0:
            raise ValueError("preemption_hysteresis must not be negative")
        if self.unallocated_hysteresis < 0:
            raise ValueError("unallocated_hysteresis must not be negative")
        if self.unallocated_preemption not in UNALLOCATED_PREEMPTION:
            raise ValueError(f"unallocated_preemption must be one of {', '.join(UNALLOCATED_PREEMPTION)}, "
                             f"got {self.unallocated_preemption!r}")
        if not 0 <= self.unallocated_headroom < 1:
            raise ValueError("unallocated_headroom must be at least 0 and below 1 (a part of each pool)")
        if self.catch_up < 0:
            raise ValueError("catch_up must not be negative")
        return self
