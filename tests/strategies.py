"""Hypothesis strategies for random small scenarios of every tree shape: trees of depth 1 to 4
(a single root now and then), one or two GPU types with 2-, 4- or 8-GPU nodes, gangs of one to
four nodes, node faults."""

from __future__ import annotations

from hypothesis import strategies as st

from tests.builders import ScenarioBuilder

HOUR = 3600


@st.composite
def trees(draw, max_depth: int = 4) -> dict[str, int]:
    """``{path: share}``: a random tree of depth 1..max_depth, 2..6 leaves, shares 0..5."""
    depth = draw(st.integers(1, max_depth))
    shares: dict[str, int] = {}
    single_root = depth > 1 and draw(st.booleans())

    def grow(parent: str | None, level: int) -> None:
        count = 1 if (parent is None and single_root) else draw(st.integers(1 if level > 1 else 2, 3))
        for k in range(count):
            path = f"{parent}/n{k}" if parent else f"n{k}"
            shares[path] = draw(st.sampled_from([1, 1, 2, 3, 5, 0] if level > 1 else [1, 2, 3]))
            if level < depth and (level == 1 or draw(st.booleans())):
                grow(path, level + 1)

    grow(None, 1)
    return shares


def leaves_of(shares: dict[str, int]) -> list[str]:
    return sorted(p for p in shares if not any(q.startswith(p + "/") for q in shares))


@st.composite
def scenarios(draw, max_workloads: int = 30):
    builder = ScenarioBuilder(duration=draw(st.integers(6 * HOUR, 2 * 86400)), seed=0)
    builder.policy(lookback_window_s=draw(st.sampled_from(["1d", "7d"])), max_min_runtime_s="2h",
                   resubmit_delay_s=draw(st.sampled_from([0, 600])),
                   unallocated_preemption=draw(st.sampled_from(["any", "fair"])),
                   # small pools: large parts, so that the headroom is a GPU or more
                   unallocated_headroom=draw(st.sampled_from([0.0, 0.0, 0.1, 0.3])))
    pools = []
    for gpu_type in ["H100", "A100"][: draw(st.integers(1, 2))]:
        nodes, gpn = draw(st.integers(2, 5)), draw(st.sampled_from([2, 4, 8]))
        builder.pool(gpu_type, nodes, gpn, draw(st.sampled_from([None, 2])))
        pools.append((gpu_type, nodes, gpn))
    shares = draw(trees())
    for path, share in shares.items():
        builder.team(path, share)
    leaves = leaves_of(shares)
    builder.checkpoint_bandwidth(draw(st.sampled_from([None, None, 1.0])))
    for i in range(draw(st.integers(3, max_workloads))):
        gpu_type, nodes, gpn = draw(st.sampled_from(pools))
        gpus = draw(st.one_of(st.integers(1, gpn), st.integers(1, min(nodes, 4)).map(lambda k, g=gpn: k * g)))
        builder.workload(
            f"w{i}", draw(st.sampled_from(leaves)), gpu_type=gpu_type, gpus=gpus, work=draw(st.integers(60, 6 * HOUR)),
            submit=draw(st.integers(0, 8 * HOUR)), min_runtime=draw(st.sampled_from([0, 0, 600, HOUR, 2 * HOUR])),
            resumable=draw(st.booleans()), checkpoint=draw(st.sampled_from([None, 300, 1800])),
            priority=draw(st.sampled_from(["low", "normal", "high", "urgent"])),
            # notices: some checkpoint (or suspend) on notice, through a storage that may be tight
            notice=draw(st.sampled_from([None, None, 30, 120])), checkpoint_gb=draw(st.sampled_from([None, 20.0, 200.0])),
            suspends=draw(st.sampled_from([None, True])))
    for _ in range(draw(st.integers(0, 2))):
        gpu_type, nodes, _ = draw(st.sampled_from(pools))
        builder.node_event(draw(st.integers(0, 10 * HOUR)), f"{gpu_type}-{draw(st.integers(0, nodes - 1)):03d}",
                           draw(st.sampled_from(["unhealthy", "failed"])), repair=draw(st.integers(600, 6 * HOUR)))
    return builder.build()


@st.composite
def contended_scenarios(draw):
    """Every leaf keeps long, resumable allocated work queued (more than the cluster holds), the
    leaves arriving at different times: fair share must move GPUs between subtrees."""
    gpn = draw(st.sampled_from([4, 8]))
    builder = ScenarioBuilder(duration=draw(st.integers(12 * HOUR, 2 * 86400)), seed=0)
    builder.policy(lookback_window_s=draw(st.sampled_from(["1d", "7d"])), max_min_runtime_s="2h",
                   catch_up=draw(st.sampled_from([0.0, 1.0])))
    nodes = draw(st.integers(3, 6))
    builder.pool("H100", nodes, gpn)
    shares = draw(trees())
    for path, share in shares.items():
        builder.team(path, share)
    for li, leaf in enumerate(leaves_of(shares)):
        arrive = draw(st.integers(0, 10 * HOUR))
        for i in range(draw(st.integers(1, 5))):
            builder.workload(
                f"l{li}-{i}", leaf, gpus=draw(st.sampled_from([1, gpn // 2, gpn, 2 * gpn])),
                work=draw(st.integers(2 * HOUR, 100 * HOUR)), submit=arrive + draw(st.integers(0, 2 * HOUR)),
                min_runtime=draw(st.sampled_from([600, HOUR, 2 * HOUR])), resumable=True,
                checkpoint=draw(st.sampled_from([600, 1800])), notice=draw(st.sampled_from([None, 30, 120])))
    return builder.build()


@st.composite
def reserved_scenarios(draw):
    """A gang reservation stands while a backlog waits: one leaf's whole-node gangs wait behind
    protected work, and the other leaves queue many small allocated requests of a few sizes whose
    minimum runtimes are short (not kept off the reserved nodes: they end before the gang can
    start) or long (kept off), mixed within a size, next to unallocated work that the allocated
    requests may take. The phase 3 and 4 walks skip requests kept off those nodes a size at a
    time (scheduler._kept_out_bound)."""
    gpn = draw(st.sampled_from([2, 4, 8]))
    nodes = draw(st.integers(3, 6))
    builder = ScenarioBuilder(duration=draw(st.integers(6 * HOUR, 86400)), seed=0)
    builder.policy(lookback_window_s=draw(st.sampled_from(["1d", "7d"])), max_min_runtime_s="2h",
                   resubmit_delay_s=draw(st.sampled_from([0, 600])),
                   unallocated_preemption=draw(st.sampled_from(["any", "fair"])),
                   unallocated_headroom=draw(st.sampled_from([0.0, 0.0, 0.2])))
    builder.pool("H100", nodes, gpn, draw(st.sampled_from([None, 2])))
    shares = draw(trees(max_depth=3))
    for path, share in shares.items():
        builder.team(path, share)
    leaves = leaves_of(shares)
    gang_leaf = draw(st.sampled_from(leaves))
    n = 0
    # protected work that fills the pool first, then the gangs
    for i in range(draw(st.integers(1, nodes))):
        builder.workload(f"p{i}", draw(st.sampled_from(leaves)), gpus=draw(st.sampled_from([1, gpn // 2 or 1, gpn])),
                         work=draw(st.integers(HOUR, 4 * HOUR)), submit=0,
                         min_runtime=draw(st.sampled_from([HOUR, 2 * HOUR])), resumable=True, checkpoint=1800)
    for i in range(draw(st.integers(1, 3))):
        builder.workload(f"g{i}", gang_leaf, gpus=gpn * draw(st.integers(2, min(nodes, 3))),
                         work=draw(st.integers(600, 2 * HOUR)), submit=draw(st.integers(0, 1800)),
                         min_runtime=draw(st.sampled_from([600, HOUR])), priority=draw(st.sampled_from(["normal", "high"])))
    sizes = draw(st.lists(st.sampled_from(sorted({1, max(1, gpn // 2), gpn})), min_size=1, max_size=3, unique=True))
    for burst in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, 3 * HOUR))
        for leaf in draw(st.lists(st.sampled_from(leaves), min_size=1, max_size=3, unique=True)):
            for _ in range(draw(st.integers(2, 12))):
                builder.workload(
                    f"b{n}", leaf, gpus=draw(st.sampled_from(sizes)), work=draw(st.integers(60, 2 * HOUR)),
                    submit=at + draw(st.integers(0, 120)),
                    min_runtime=draw(st.sampled_from([0, 60, 300, 600, 600, HOUR, 2 * HOUR, 2 * HOUR])),
                    resumable=draw(st.booleans()), checkpoint=draw(st.sampled_from([None, 300, 1800])),
                    priority=draw(st.sampled_from(["low", "normal", "high"])),
                    notice=draw(st.sampled_from([None, None, 30])))
                n += 1
    return builder.build()
