"""A budget change carries only the shares it changes (events.BudgetChanged.changed): its size
follows the change, not the tree; every reader applying it to the tree the log made so far ends
with the tree a whole map would have given; a change made from shares the log no longer holds
is named (events.budget_conflict)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from timeshare import events as ev
from timeshare.state import SchedulerState
from timeshare.tree import AllocationTree

#: a tree of 100 programs of 100 leaves each: 10,100 nodes
BIG = {f"t{i}": 1.0 for i in range(100)} | {f"t{i // 100}/l{i % 100}": 1.0 for i in range(10_000)}


def _change(old: dict[str, float], new: dict[str, float], event_id: str = "c1") -> ev.BudgetChanged:
    return ev.BudgetChanged(event_id=event_id, at_ms=0, by="root", reason="r", changed=ev.share_changes(old, new))


def test_a_change_of_a_large_tree_is_as_large_as_the_change():
    one_share = _change(BIG, BIG | {"t3/l7": 2.0})
    assert len(ev.encoder.encode(one_share)) < 200
    added = BIG | {f"t5/new{i:04d}": 1.0 for i in range(1_000)}
    whole = ev.BudgetChanged(event_id="c1", at_ms=0, by="root", reason="r", old=BIG, new=added)
    # 1,000 new leaves: about 40 bytes each, against both whole maps of 11,100 and 10,100 paths
    delta_bytes, whole_bytes = len(ev.encoder.encode(_change(BIG, added))), len(ev.encoder.encode(whole))
    assert delta_bytes < 50_000 and whole_bytes > 5 * delta_bytes, (delta_bytes, whole_bytes)


# tree-shaped maps (a path's parent is in the map too), never empty
shares = st.dictionaries(st.sampled_from(["a", "a/x", "a/x/1", "a/x/2", "a/y", "b", "b/z", "c"]),
                         st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]), max_size=8).map(
    lambda d: {"z": 1.0} | {p: s for p, s in d.items()
                            if all(q in d for q in [p[:i] for i, ch in enumerate(p) if ch == "/"])})


@settings(max_examples=200, deadline=None)
@given(shares, shares)
def test_applying_the_changes_to_the_map_before_gives_the_map_after(old, new):
    e = ev.decoder.decode(ev.encoder.encode(_change(old, new)))
    assert ev.shares_after(e, old) == new
    assert ev.budget_conflict(e, AllocationTree.from_shares(old)) is None
    # every path whose share differs, but those below a removed path: they go with it
    differ = {p for p in old.keys() | new.keys() if old.get(p) != new.get(p)}
    assert set(e.changed) == {p for p in differ if not ("/" in p and p.rsplit("/", 1)[0] in old.keys() - new.keys())}


def test_retiring_a_program_of_30000_projects_is_one_entry():
    tree = {"p": 1.0, "q": 1.0} | {f"p/t{i}": 1.0 for i in range(300)} | {f"p/t{i // 100}/l{i}": 1.0 for i in range(30_000)}
    after = {"q": 1.0}
    e = _change(tree, after)
    assert e.changed == {"p": ev.ShareChange(old=1.0, new=None)}
    assert ev.shares_after(e, tree) == after and ev.shares_after(e, tree | {"p/late": 2.0}) == after


def test_a_change_made_from_shares_the_log_no_longer_holds_is_named():
    before = {"a": 1.0, "b": 1.0}
    e = _change(before, {"a": 2.0, "b": 1.0, "c": 1.0})
    assert ev.budget_conflict(e, AllocationTree.from_shares({"a": 3.0, "b": 1.0})) == (
        "a: its share is 3, not 1 as the change was made from (another change came first; read the tree again "
        "and send the change again)")
    assert "c: its share is 1, not absent" in ev.budget_conflict(e, AllocationTree.from_shares({"a": 1.0, "b": 1.0, "c": 1.0}))
    # a change of other paths made from the same tree is no conflict: both apply
    assert ev.budget_conflict(e, AllocationTree.from_shares({"a": 1.0, "b": 5.0})) is None
    assert ev.shares_after(e, {"a": 1.0, "b": 5.0}) == {"a": 2.0, "b": 5.0, "c": 1.0}


def test_a_change_written_as_two_whole_maps_reads_as_before():
    raw = b'{"type":"budget.changed","event_id":"e","at_ms":1,"by":"root","reason":"r","old":{"a":1.0},' \
          b'"new":{"a":2.0,"b":1.0}}'
    e = ev.decoder.decode(raw)
    assert e.changed == {} and ev.shares_after(e, {"a": 7.0, "z": 1.0}) == {"a": 2.0, "b": 1.0}
    assert ev.budget_conflict(e, AllocationTree.from_shares({"anything": 1.0})) is None
    # written now: no whole map, no null fields
    assert b'"old"' not in ev.encoder.encode(_change({"a": 1.0}, {"a": 2.0})).replace(b'{"old"', b"")


def test_the_core_applies_a_change_to_its_tree_as_a_whole_map_would():
    from timeshare.cluster import Cluster, PoolSpec
    from timeshare.config import PolicyConfig

    def state_with(shares: dict[str, float]) -> SchedulerState:
        return SchedulerState(AllocationTree.from_shares(shares), Cluster([PoolSpec("H100", 2, 8)]), PolicyConfig())

    old = {"a": 1.0, "a/x": 1.0, "a/y": 2.0, "b": 1.0}
    new = {"a": 3.0, "a/x": 1.0, "b": 1.0, "b/z": 1.0}
    by_change, by_maps = state_with(old), state_with(old)
    by_change.apply(_change(old, new))
    by_maps.apply(ev.BudgetChanged(event_id="c1", at_ms=0, by="root", reason="r", old=old, new=new))
    assert by_change.tree.shares() == by_maps.tree.shares() == new
    assert {p: n.fraction for p, n in by_change.tree.nodes.items()} == \
        {p: n.fraction for p, n in AllocationTree.from_shares(new).nodes.items()}
