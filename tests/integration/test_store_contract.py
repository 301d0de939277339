"""One contract for both stores: PostgreSQL and the in-memory one rebuilt from the stream."""

from __future__ import annotations

import asyncio

import pytest

from services.common.store import Changes, MemoryStore, PostgresStore

pytestmark = pytest.mark.integration


@pytest.fixture(params=["memory", "postgres"])
async def store(request, database_url):
    s = MemoryStore() if request.param == "memory" else PostgresStore(database_url, "contract")
    await s.open()
    yield s
    await s.close()


def changes(**puts) -> Changes:
    c = Changes()
    for key, doc in puts.items():
        c.put("thing", key, doc)
    return c


async def test_a_fresh_store_has_applied_nothing(store):
    assert await store.last_seq("c") == 0
    assert await store.get("thing", "x") is None
    assert await store.scan("thing") == []
    assert await store.journal("thing", "x") == []


async def test_commit_writes_documents_journal_and_sequence_together(store):
    c = changes(a={"n": 1}, b={"n": 2})
    c.append("thing", "a", {"event": 1})
    assert await store.commit("c", 5, c) is True
    assert await store.last_seq("c") == 5
    assert await store.get("thing", "a") == {"n": 1}
    assert await store.get_many("thing", ["a", "b", "zz"]) == {"a": {"n": 1}, "b": {"n": 2}}
    assert await store.scan("thing") == [("a", {"n": 1}), ("b", {"n": 2})]
    assert await store.journal("thing", "a") == [{"event": 1}]


async def test_a_journal_page_is_the_newest_entries_before_a_seq_oldest_first(store):
    key = f"paged-{id(store)}"
    for seq in range(1, 8):
        c = Changes()
        c.append("history", key, {"seq": seq * 10, "what": f"w{seq}"})
        c.append("history", "another", {"seq": seq * 10, "what": "not this key"})
        assert await store.commit(f"paging-{id(store)}", seq, c)
    assert await store.journal_page("history", key, 3) == ([{"seq": 50, "what": "w5"}, {"seq": 60, "what": "w6"},
                                                             {"seq": 70, "what": "w7"}], True)
    assert await store.journal_page("history", key, 2, before_seq=50) == ([{"seq": 30, "what": "w3"},
                                                                           {"seq": 40, "what": "w4"}], True)
    assert await store.journal_page("history", key, 5, before_seq=30) == ([{"seq": 10, "what": "w1"},
                                                                           {"seq": 20, "what": "w2"}], False)
    assert await store.journal_page("history", key, 7) == (await store.journal("history", key), False)
    assert await store.journal_page("history", "nobody", 3) == ([], False)


async def test_a_redelivered_sequence_changes_nothing(store):
    await store.commit("c", 5, changes(a={"n": 1}))
    again = changes(a={"n": 99})
    again.append("thing", "a", {"event": "dup"})
    assert await store.commit("c", 5, again) is False
    assert await store.commit("c", 4, again) is False
    assert await store.get("thing", "a") == {"n": 1}
    assert await store.journal("thing", "a") == []


async def test_consumers_keep_separate_sequences(store):
    await store.commit("one", 10, changes(a={"n": 1}))
    assert await store.commit("two", 3, changes(b={"n": 2})) is True
    assert (await store.last_seq("one"), await store.last_seq("two")) == (10, 3)


async def test_putting_none_deletes_and_prefix_scan_filters(store):
    await store.commit("c", 1, changes(**{"x/1": {"v": 1}, "x/2": {"v": 2}, "y/1": {"v": 3}}))
    await store.commit("c", 2, changes(**{"x/1": None}))
    assert await store.scan("thing", "x/") == [("x/2", {"v": 2})]


async def test_put_if_absent_keeps_the_first_document(store):
    assert await store.put_if_absent("idem", "k", {"w": 1}) is None
    assert await store.put_if_absent("idem", "k", {"w": 2}) == {"w": 1}
    assert await store.get("idem", "k") == {"w": 1}


async def test_concurrent_put_if_absent_has_one_winner(store):
    results = await asyncio.gather(*(store.put_if_absent("idem", "race", {"w": i}) for i in range(8)))
    assert sum(r is None for r in results) == 1


async def test_documents_are_copies_not_shared_objects(store):
    await store.commit("c", 1, changes(a={"list": [1]}))
    doc = await store.get("thing", "a")
    doc["list"].append(2)
    assert await store.get("thing", "a") == {"list": [1]}
