"""find_victims with ``prune`` skips a node whose cheapest victim already ranks behind the best
node found (placement.py): the node it returns is the one that ranks best when every node is searched on
its own and ranked by rules.node_rank, on random pools of mixed work, costs, caps and limits."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import ScenarioBuilder, spec
from timeshare.placement import find_victims
from timeshare.rules import node_rank

GPN = 8


@st.composite
def searches(draw):
    nodes = draw(st.integers(2, 6))
    # per node, the GPUs of the workloads on it (each at most what is left)
    layout = []
    for _ in range(nodes):
        # mostly full nodes (a search ranks only nodes whose free GPUs do not suffice)
        left, on = GPN, []
        keep_free = draw(st.sampled_from([0, 0, 0, 1, 2, 4]))
        while left > keep_free:
            g = draw(st.sampled_from([g for g in (1, 2, 4, 8) if g <= left - keep_free] or [left - keep_free]))
            on.append(g)
            left -= g
        layout.append(on)
    n_work = sum(len(on) for on in layout)
    allowed = draw(st.lists(st.booleans(), min_size=n_work, max_size=n_work))
    allocated = draw(st.lists(st.booleans(), min_size=n_work, max_size=n_work))
    # many ties on the loss, as in a real pool (victims costing the same notice)
    lost = draw(st.lists(st.sampled_from([0, 480, 960, 1920, 3600, 7200]), min_size=n_work, max_size=n_work))
    groups = draw(st.lists(st.sampled_from(["b1", "b2", None]), min_size=n_work, max_size=n_work))
    caps = {"b1": draw(st.integers(0, 8)), "b2": draw(st.integers(0, 16))}
    return {"layout": layout, "allowed": allowed, "allocated": allocated, "lost": lost, "groups": groups,
            "caps": caps, "gpus": draw(st.integers(1, GPN)), "free_limit": draw(st.sampled_from([-1, 0, 1, 2, 4])),
            "use_caps": draw(st.booleans()), "use_side_caps": draw(st.booleans())}


def _cluster(case):
    nodes = len(case["layout"])
    h = ScenarioBuilder().pool(nodes=nodes, gpus_per_node=GPN).team("t", 1).harness()
    state = h.state
    meta = {}
    k = 0
    for i, on in enumerate(case["layout"]):
        for g in on:
            wid = f"w{k:02d}"
            h.submit(spec(wid, "t", gpus=g, min_runtime=0, work="20h"))
            state.apply(state.started(state.workloads[wid], [state.cluster.node(f"H100-{i:03d}")], 0))
            meta[wid] = k
            k += 1
    return h, state, meta


@settings(max_examples=400, deadline=None)
@given(case=searches())
def test_the_node_found_is_the_best_ranked_of_every_node_searched_alone(case):
    h, state, meta = _cluster(case)
    pool = state.cluster.pool("H100")

    def may_preempt(w):
        return case["allowed"][meta[w.id]]

    def cost(w):
        k = meta[w.id]
        return (1 if case["allocated"][k] else 0, case["lost"][k], -0.5, w.id)

    def group(w):
        g = case["groups"][meta[w.id]]
        return None if g is None else (g, case["caps"][g])

    kw = dict(by_fit=True, free_limit=case["free_limit"], caps=group if case["use_caps"] else None,
              side_caps=group if case["use_side_caps"] else None)
    gpus = case["gpus"]
    found = find_victims(state, pool, gpus, may_preempt, cost, prune=True, **kw)

    # the reference: each open node searched on its own (no best to compare with), ranked
    best = None
    for node in pool.open_nodes(gpus):
        plan = find_victims(state, pool, gpus, may_preempt, cost, only=[node], **kw)
        if plan is None:
            continue
        _, victims = plan
        if not victims:  # free GPUs suffice: the first such node, as the search itself does
            best = (None, plan)
            break
        costs = [cost(v) for v in victims]
        on_node = [node.holders[v.id] for v in victims]
        free = node.free if case["free_limit"] < 0 or node.free <= case["free_limit"] else case["free_limit"]
        got = free + sum(on_node)
        freed = sum(v.gpus - n for v, n in zip(victims, on_node))
        rank = node_rank(max(costs), got + freed - gpus, sum(c[1] for c in costs), len(victims), node.index,
                         math.inf)
        if best is None or (best[0] is not None and rank < best[0]):
            best = (rank, plan)
    if best is None:
        assert found is None
    else:
        assert found is not None
        assert [n.index for n in found[0]] == [n.index for n in best[1][0]]
        assert [v.id for v in found[1]] == [v.id for v in best[1][1]]
