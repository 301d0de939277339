"""The allocation tree: a node's fraction is the product of share / sum(sibling shares) down
its path; invalid trees and non-leaf submit targets are errors that name the path."""

from __future__ import annotations

import math

import pytest

from timeshare.tree import AllocationTree, TreeError, ancestors, is_within

AI2_LIKE = {
    "prior": 40, "prior/olmo": 6, "prior/olmo/pretrain": 5, "prior/olmo/midtrain": 3,
    "prior/molmo": 3, "prior/infra": 1,
    "tulu": 35, "tulu/sft": 3, "tulu/rl": 4,
    "science": 25,
}


def expected_fraction(shares: dict[str, float], path: str) -> float:
    """Independent computation: product over the path of share / sum(sibling shares)."""
    fraction = 1.0
    for node in ancestors(path):
        parent = node.rsplit("/", 1)[0] if "/" in node else None
        siblings = [p for p in shares if (p.rsplit("/", 1)[0] if "/" in p else None) == parent]
        total = sum(shares[s] for s in siblings)
        fraction *= shares[node] / total if total else 0.0
    return fraction


@pytest.mark.parametrize("path", sorted(AI2_LIKE))
def test_a_nodes_fraction_is_the_product_of_its_share_among_siblings_down_the_path(path):
    tree = AllocationTree.from_shares(AI2_LIKE)
    assert tree.fraction(path) == pytest.approx(expected_fraction(AI2_LIKE, path), rel=1e-12)


@pytest.mark.parametrize("shares, path, fraction", [
    ({"a": 1, "b": 1}, "a", 0.5),
    ({"a": 50, "b": 30, "c": 20}, "b", 0.3),
    ({"p": 1, "p/x": 3, "p/y": 1, "q": 1}, "p/x", 0.5 * 0.75),
    ({"prior": 5, "prior/olmo": 3, "prior/olmo/pretrain": 7, "other": 5}, "prior/olmo/pretrain", 0.5),
], ids=["two equal siblings split in half", "shares are proportions, not percentages of a fixed total",
        "two levels multiply", "an only child inherits its parent's whole fraction"])
def test_known_fractions(shares, path, fraction):
    assert AllocationTree.from_shares(shares).fraction(path) == pytest.approx(fraction)


def test_the_leaves_fractions_add_up_to_the_whole_cluster():
    tree = AllocationTree.from_shares(AI2_LIKE)
    assert math.fsum(tree.fraction(leaf) for leaf in tree.leaves) == pytest.approx(1.0)


@pytest.mark.parametrize("shares, culprit, words", [
    ({"a/b": 1}, "a/b", "unknown parent"),
    ({"a": 1, "a/b/c": 1}, "a/b/c", "unknown parent"),
    ({"a": -1, "b": 1}, "a", "negative"),
    ({"a": float("nan")}, "a", "number"),
    ({"a": "1"}, "a", "number"),
    ({"a": True}, "a", "number"),
    ({"/a": 1}, "/a", "slash path"),
    ({"a//b": 1, "a": 1}, "a//b", "slash path"),
    ({}, "(tree)", "empty"),
], ids=["a child whose parent is not declared", "a grandchild whose parent is missing",
        "a negative share", "a share that is not finite", "a share given as text", "a boolean share",
        "a path with a leading slash", "a path with an empty segment", "an empty tree"])
def test_invalid_trees_are_errors_naming_the_path(shares, culprit, words):
    with pytest.raises(TreeError) as err:
        AllocationTree.from_shares(shares)
    assert err.value.path == culprit
    assert words in str(err.value)


def test_work_must_be_submitted_against_a_leaf_not_a_parent():
    tree = AllocationTree.from_shares({"p": 1, "p/x": 1})
    assert tree.require_leaf("p/x").path == "p/x"
    with pytest.raises(TreeError, match="submit against a leaf") as err:
        tree.require_leaf("p")
    assert err.value.path == "p"


def test_an_unknown_submit_target_is_an_error():
    with pytest.raises(TreeError, match="unknown allocation"):
        AllocationTree.from_shares({"p": 1}).require_leaf("q")


def test_a_zero_share_means_no_budget_fraction_zero_and_the_siblings_split_the_rest():
    # documented: a zero share means no budget; such leaves run only unallocated work
    tree = AllocationTree.from_shares({"a": 0, "b": 1, "c": 3, "c/x": 0, "c/y": 2})
    assert tree.fraction("a") == 0.0
    assert tree.fraction("b") == pytest.approx(0.25)
    assert tree.fraction("c/x") == 0.0
    assert tree.fraction("c/y") == pytest.approx(0.75)


def test_all_zero_siblings_get_nothing_rather_than_dividing_by_zero():
    tree = AllocationTree.from_shares({"a": 0, "b": 0})
    assert tree.fraction("a") == tree.fraction("b") == 0.0


def test_changing_a_share_returns_a_new_validated_tree_and_leaves_the_old_one_alone():
    tree = AllocationTree.from_shares({"a": 1, "b": 1})
    changed = tree.with_shares({"a": 3})
    assert changed.fraction("a") == pytest.approx(0.75)
    assert tree.fraction("a") == pytest.approx(0.5)
    with pytest.raises(TreeError):
        tree.with_shares({"c/d": 1})
    assert tree.without("a").leaves == ["b"]


@pytest.mark.parametrize("a, b, split", [
    ("p/x", "p/y", ("p/x", "p/y")),
    ("p/x", "q", ("p", "q")),
    ("p/x", "p/x", None),
], ids=["siblings part at their own level", "cousins part at the top level", "a leaf does not part from itself"])
def test_divergence_names_the_sibling_subtrees_where_two_paths_part(a, b, split):
    tree = AllocationTree.from_shares({"p": 1, "p/x": 1, "p/y": 1, "q": 1})
    assert tree.divergence(a, b) == split


def test_path_helpers():
    assert ancestors("a/b/c") == ["a", "a/b", "a/b/c"]
    assert is_within("a/b", "a") and is_within("a", "a")
    assert not is_within("ab", "a")


def _random_shares(rng, leaves_wanted: int) -> dict[str, float]:
    """A random tree whose names sort awkwardly ('a-b' sorts between 'a' and 'a/...')."""
    names = ["a", "a-b", "a.c", "b", "b0", "c_d", "z"]
    shares: dict[str, float] = {}
    frontier = [""]
    while frontier and sum(1 for p in shares if not any(q.startswith(p + "/") for q in shares)) < leaves_wanted:
        parent = frontier.pop(rng.randrange(len(frontier)))
        for name in rng.sample(names, rng.randint(1, 4)):
            path = f"{parent}/{name}" if parent else name
            if path.count("/") < 5:
                shares[path] = float(rng.randint(0, 5))
                frontier.append(path)
    return shares


def _pairwise_splits(tree):
    """The leaf-pair table the tree used to build, computed the slow way."""
    out = {}
    for leaf in tree.leaves:
        rows = []
        for other in tree.leaves:
            if other == leaf:
                continue
            a, b = next((x, y) for x, y in zip(ancestors(leaf), ancestors(other)) if x != y)
            rows.append((other, a, b, tree.index[a], tree.index[b]))
        out[leaf] = rows
    return out


@pytest.mark.parametrize("seed", range(12))
def test_where_two_paths_part_is_computed_from_per_node_data_as_a_pair_table_would_say(seed):
    import random

    tree = AllocationTree.from_shares(_random_shares(random.Random(seed), 3 + seed * 3))
    expected = _pairwise_splits(tree)
    for leaf in tree.leaves:
        assert tree.split_index[leaf] == expected[leaf]
        groups = []
        for other, a, b, ai, bi in expected[leaf]:
            if groups and groups[-1][:2] == (a, b):
                groups[-1][4].append((other, tree.index[other]))
            else:
                groups.append((a, b, ai, bi, [(other, tree.index[other])]))
        assert tree.split_group_index[leaf] == groups
        for other, a, b, _, _ in expected[leaf]:
            assert tree.divergence(leaf, other) == (a, b)


def test_a_share_change_without_new_nodes_keeps_the_structure_and_recomputes_fractions():
    tree = AllocationTree.from_shares(AI2_LIKE)
    changed = tree.with_shares({"prior/olmo": 1, "tulu": 70})
    fresh = AllocationTree.from_shares({**AI2_LIKE, "prior/olmo": 1, "tulu": 70})
    assert changed.path_index is tree.path_index
    assert changed.shares() == fresh.shares()
    for path in fresh.nodes:
        assert changed.fraction(path) == fresh.fraction(path)
        assert changed.nodes[path].children == fresh.nodes[path].children
    assert tree.fraction("tulu") == pytest.approx(0.35)
    with pytest.raises(TreeError):
        tree.with_shares({"tulu": -1})


def test_a_pickled_tree_holds_its_nodes_only_and_loads_with_every_index():
    import pickle

    tree = AllocationTree.from_shares(AI2_LIKE)
    data = pickle.dumps(tree)
    loaded = pickle.loads(data)
    assert loaded.shares() == tree.shares()
    for leaf in tree.leaves:
        assert loaded.split_index[leaf] == tree.split_index[leaf]
        assert loaded.fraction(leaf) == tree.fraction(leaf)
    assert b"split" not in data
