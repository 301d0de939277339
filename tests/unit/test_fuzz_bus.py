"""Hypothesis over every bus decoder and the command handlers' decisions (no servers).

* every decoder (events, the gateway's submission body, each command body, the manual clock's
  tick) refuses what it cannot read with its own error, never another exception;
* placement's rules for proposed events (``Placement._accept``) either refuse an event
  (``Rejected``, and the state is exactly what it was) or accept events that apply cleanly
  and leave a state a scheduling pass can run on;
* a manager's tree change (``check_change``) is a valid tree or a TreeError naming the path.

The number of inputs each property tried is printed at the end of the session.
"""

from __future__ import annotations

import math
import string
from pathlib import Path

import msgspec
import pytest
from fastapi import HTTPException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common import commands
from services.common.cluster_config import load_cluster
from services.common.clock import make_clock
from services.common.settings import Settings
from services.gateway import limits
from services.placement import view
from services.placement.inbox import Rejected, Tick
from services.placement.service import Placement
from timeshare import events as ev
from timeshare.state import SchedulerState
from timeshare.tree import AllocationTree, TreeError, check_change
from timeshare.workload import WorkloadSpec

CONFIG = load_cluster(str(Path(__file__).parents[1] / "integration" / "data" / "small.toml"), "fuzz")
#: what each property tried (printed by tests/conftest.py)
TRIED: dict[str, int] = {}
EXAMPLES = 300


def _count(name: str) -> None:
    TRIED[name] = TRIED.get(name, 0) + 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=12)
raw_bytes = st.binary(max_size=200) | json_values.map(msgspec.json.encode)

DECODERS = {
    "events": lambda b: ev.decoder.decode(b),
    "tick": lambda b: msgspec.json.decode(b, type=Tick),
    **{f"command {t.__name__}": (lambda d: lambda b: d.decode(b))(d) for t, d in commands.DECODERS.items()},
}


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_every_bus_decoder_refuses_what_it_cannot_read_with_its_own_error(name):
    decode = DECODERS[name]

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True)
    @given(raw_bytes)
    def run(data: bytes) -> None:
        _count(f"decoder {name}")
        try:
            decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass

    run()


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True)
@given(st.one_of(raw_bytes, st.fixed_dictionaries(
    {"project": st.sampled_from(["alpha/train", "a\x00", "x" * 300]), "gpu_type": st.just("H100"),
     "gpus": st.integers(-5, 10**7), "work_s": st.integers(-5, 10**9) | st.floats(),
     "min_runtime_s": st.integers(-5, 10**9)},
    optional={"id": st.text(max_size=140), "kind": st.text(max_size=300), "min_runtme_s": st.integers()},
).map(msgspec.json.encode)))
def test_the_gateway_submission_body_is_refused_with_a_4xx_naming_the_field_or_within_every_limit(data):
    _count("decoder gateway submission body")
    try:
        req = limits.decode_submit(data)
    except HTTPException as exc:
        assert exc.status_code in (400, 422) and exc.detail
        return
    assert 1 <= req.gpus <= limits.MAX_GPUS and 0 < req.work_s <= limits.MAX_WORK_S
    assert 0 <= req.min_runtime_s <= req.work_s
    assert req.id is None or limits.ID_RE.match(req.id)


# -- placement's rules for proposed events -------------------------------------------------
def _state() -> SchedulerState:
    """The small cluster with a running workload, a pending one and a drained node."""
    state = SchedulerState(CONFIG.tree(), CONFIG.cluster(), CONFIG.policy, name="fuzz")
    for i, gpus in enumerate((4, 4, 4)):
        spec = WorkloadSpec(id=f"w{i}", submit_s=0, project="alpha/train" if i % 2 else "beta/debug",
                            gpu_type="H100", gpus=gpus, work_s=600, min_runtime_s=60, user="carol")
        state.apply(ev.WorkloadSubmitted(event_id=f"sub.w{i}", at_ms=0, cluster="fuzz", workload=spec))
    from timeshare.scheduler import BudgetPolicy

    for e in BudgetPolicy().schedule(state, 1):
        pass
    return state


ids = st.sampled_from(["w0", "w1", "w2", "new", "new2", "", "w0/x"])
SHARES = CONFIG.tree().shares()
nodes = st.sampled_from(["H100-000", "H100-001", "H100-999", "B200-000", ""])
times = st.integers(-1, 10**13)
events = st.one_of(
    st.builds(lambda i, a, wid, att: ev.WorkloadCompleted(event_id=f"c{i}", at_ms=a, cluster="fuzz", workload_id=wid,
                                                          attempt=att),
              st.integers(0, 99), times, ids, st.none() | st.integers(-1, 3)),
    st.builds(lambda i, a, wid: ev.WorkloadFailed(event_id=f"f{i}", at_ms=a, cluster="fuzz", workload_id=wid,
                                                  reason="x"), st.integers(0, 99), times, ids),
    st.builds(lambda i, a, wid: ev.WorkloadCancelled(event_id=f"x{i}", at_ms=a, cluster="fuzz", workload_id=wid,
                                                     by="mallory"), st.integers(0, 99), times, ids),
    st.builds(lambda i, a, wid, gpus, work, mr, project: ev.WorkloadSubmitted(
        event_id=f"s{i}", at_ms=a, cluster="fuzz", workload=WorkloadSpec(
            id=wid, submit_s=0, project=project, gpu_type="H100", gpus=gpus, work_s=work, min_runtime_s=mr)),
        st.integers(0, 99), times, ids, st.sampled_from([1, 2, 4, 8, 0, -1, 6, 100]),
        st.sampled_from([1, 600, 10**6, 0, -1]), st.sampled_from([0, 60, 3600, 7200, -1]),
        st.sampled_from(["alpha/train", "alpha", "gamma", "beta/debug"])),
    st.builds(lambda i, a, n: ev.NodeUnhealthy(event_id=f"u{i}", at_ms=a, cluster="fuzz", node=n, reason="r",
                                               needs_human=False), st.integers(0, 99), times, nodes),
    st.builds(lambda i, a, n: ev.NodeFailed(event_id=f"n{i}", at_ms=a, cluster="fuzz", node=n, reason="r"),
              st.integers(0, 99), times, nodes),
    st.builds(lambda i, a, n: ev.NodeRepaired(event_id=f"r{i}", at_ms=a, cluster="fuzz", node=n),
              st.integers(0, 99), times, nodes),
    st.builds(lambda i, a, shares: ev.BudgetChanged(event_id=f"b{i}", at_ms=a, cluster="fuzz", by="mallory",
                                                    reason="r", old={}, new=shares),
              st.integers(0, 99), times,
              st.dictionaries(st.sampled_from(["alpha", "alpha/train", "alpha/train/x", "beta", "beta/debug", "/x"]),
                              st.floats(min_value=-1, max_value=1e20), max_size=6)),
    st.builds(lambda i, path, share: ev.BudgetChanged(event_id=f"b{i}", at_ms=0, cluster="fuzz", by="mallory",
                                                      reason="r", old=SHARES, new={**SHARES, path: share}),
              st.integers(0, 99), st.sampled_from(["alpha", "beta/debug", "beta/debug/x", "gamma", "alpha/new"]),
              st.sampled_from([0.0, 1.0, 3.0])),
    # as changes are written now: some shares, each with the one it replaces (right, stale or absent)
    st.builds(lambda i, changed: ev.BudgetChanged(event_id=f"bc{i}", at_ms=0, cluster="fuzz", by="mallory",
                                                  reason="r", changed=changed),
              st.integers(0, 99),
              st.dictionaries(st.sampled_from(["alpha", "alpha/train", "alpha/train/x", "beta", "beta/debug", "gamma"]),
                              st.builds(lambda old, new: ev.ShareChange(old=old, new=new),
                                        st.sampled_from([None, 0.0, 1.0, 3.0]),
                                        st.sampled_from([None, -1.0, 0.0, 1.0, 3.0, 1e20])), max_size=4)),
    st.builds(lambda i: ev.BudgetChanged(event_id=f"bx{i}", at_ms=0, cluster="fuzz", by="mallory", reason="r",
                                         old=SHARES, new={p: s for p, s in SHARES.items() if not p.startswith("beta")}),
              st.integers(0, 99)),
    # decisions only placement makes, and another cluster's events
    st.builds(lambda i, wid: ev.WorkloadStarted(event_id=f"st{i}", at_ms=0, cluster="fuzz", workload_id=wid,
                                                project="alpha/train", gpu_type="H100", gpus=4,
                                                placement=[ev.NodeGpus(node="H100-000", gpu_ids=[0, 1, 2, 3])],
                                                allocated=True, protected_until_ms=None), st.integers(0, 99), ids),
    st.builds(lambda i: ev.NodeDrained(event_id=f"d{i}", at_ms=0, cluster="other", node="H100-000"),
              st.integers(0, 99)),
)


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events, min_size=1, max_size=6))
def test_placement_refuses_a_proposal_and_changes_nothing_or_applies_it_cleanly(proposals):
    placement = Placement(Settings(), CONFIG, make_clock("manual"))
    placement.cluster = "fuzz"
    placement.state = state = _state()
    for e in proposals:
        _count("handler placement proposals")
        _count(f"handler placement proposals {ev.event_type(e)}")
        # through the wire format, as the inbox delivers it
        e = ev.decoder.decode(ev.encoder.encode(e))
        before = view.digest(state)
        try:
            accepted = placement._accept(e)
        except Rejected as exc:
            assert str(exc)
            assert view.digest(state) == before, f"a refused {ev.event_type(e)} changed the state"
            continue
        _count(f"handler placement proposals accepted {ev.event_type(e)}")
        for a in accepted:
            state.apply(a)
        placement.policy.schedule(state, state.last_event_ms / 1000)
        assert all(w.leaf in state.tree.nodes and state.tree.nodes[w.leaf].is_leaf
                   for w in state.workloads.values() if w.state in ("pending", "running")), "work hidden"


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True)
@given(st.dictionaries(st.text(alphabet=string.ascii_letters + string.digits + "/._-\x00\x0e ", max_size=12),
                       st.floats() | st.integers(-10, 10**18) | st.booleans() | st.none(), max_size=5),
       st.dictionaries(st.sampled_from(["alpha/train", "beta/debug"]), st.integers(0, 3)))
def test_a_tree_change_is_a_valid_tree_or_a_tree_error_naming_the_path(shares, work):
    _count("handler budget tree change")
    tree = CONFIG.tree()
    before = tree.shares()
    try:
        new = check_change(tree, shares, work)
    except TreeError as exc:
        assert exc.path is not None and exc.message
        assert tree.shares() == before
        return
    AllocationTree.from_shares(new.shares())
    for path, share in shares.items():
        assert math.isfinite(new.nodes[path].share) and 0 <= share <= 1e6
    for leaf, n in work.items():
        if n:
            assert new.nodes[leaf].is_leaf, f"{leaf} holds work and became a parent"
