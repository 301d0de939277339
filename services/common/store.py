"""Service stores: PostgreSQL (asyncpg) and in-memory, behind one contract.

A service keeps its state as JSON documents (``records``), append-only histories
(``journal``) and the stream sequence each consumer applied (``offsets``). ``commit`` writes
a batch of changes *and* the consumer's new sequence in one transaction and refuses a batch
whose sequence is not past the recorded one, so a redelivery changes nothing. The memory
store has the same behaviour; a service using it rebuilds by replaying the stream (its
durable consumer is moved back to the store's sequence, see Bus.consume). One contract test
suite (tests/integration/test_store_contract.py) runs over both.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from .settings import ROOT

MIGRATIONS = ROOT / "infra" / "migrations"


@dataclass
class Changes:
    """What one consumer batch changes: documents to put (None deletes) and journal entries."""

    puts: dict[tuple[str, str], dict | None] = field(default_factory=dict)
    appends: list[tuple[str, str, dict]] = field(default_factory=list)

    def put(self, kind: str, key: str, doc: dict | None) -> None:
        self.puts[(kind, key)] = doc

    def append(self, kind: str, key: str, doc: dict) -> None:
        self.appends.append((kind, key, doc))


class StoreBehind(Exception):
    """The store holds an older sequence than its writer last stored: it went back in time
    (a crash lost commits made with ``synchronous_commit=off``, a restore from a backup).
    The writer must reload its state from the store and read the stream again from there."""

    def __init__(self, consumer: str, stored_seq: int, expected_seq: int):
        super().__init__(f"{consumer}: the store holds sequence {stored_seq}, {expected_seq} was stored before")
        self.stored_seq = stored_seq


class MemoryStore:
    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}
        self.records: dict[tuple[str, str], dict] = {}
        self.journals: dict[tuple[str, str], list[dict]] = {}
        self.lock = asyncio.Lock()

    async def open(self) -> "MemoryStore":
        return self

    async def close(self) -> None:
        pass

    async def last_seq(self, consumer: str) -> int:
        return self.offsets.get(consumer, 0)

    async def commit(self, consumer: str, seq: int, changes: Changes, expect_at_least: int = 0) -> bool:
        async with self.lock:
            if self.offsets.get(consumer, 0) < expect_at_least:
                raise StoreBehind(consumer, self.offsets.get(consumer, 0), expect_at_least)
            if seq <= self.offsets.get(consumer, 0):
                return False
            for key, doc in changes.puts.items():
                if doc is None:
                    self.records.pop(key, None)
                else:
                    self.records[key] = copy.deepcopy(doc)
            for kind, key, doc in changes.appends:
                self.journals.setdefault((kind, key), []).append(copy.deepcopy(doc))
            self.offsets[consumer] = seq
            return True

    async def get(self, kind: str, key: str) -> dict | None:
        doc = self.records.get((kind, key))
        return copy.deepcopy(doc) if doc is not None else None

    async def get_many(self, kind: str, keys: list[str]) -> dict[str, dict]:
        return {k: copy.deepcopy(self.records[(kind, k)]) for k in keys if (kind, k) in self.records}

    async def scan(self, kind: str, prefix: str = "") -> list[tuple[str, dict]]:
        return sorted((k, copy.deepcopy(d)) for (kd, k), d in self.records.items() if kd == kind and k.startswith(prefix))

    async def journal(self, kind: str, key: str, skip: int = 0) -> list[dict]:
        return copy.deepcopy(self.journals.get((kind, key), [])[skip:])

    async def journal_page(self, kind: str, key: str, limit: int, before_seq: int | None = None
                           ) -> tuple[list[dict], bool]:
        entries = [d for d in self.journals.get((kind, key), []) if before_seq is None or d["seq"] < before_seq]
        return copy.deepcopy(entries[-limit:]), len(entries) > limit

    async def put_if_absent(self, kind: str, key: str, doc: dict) -> dict | None:
        """Insert ``doc`` unless the key exists; returns the existing document or None."""
        async with self.lock:
            if (kind, key) in self.records:
                return copy.deepcopy(self.records[(kind, key)])
            self.records[(kind, key)] = copy.deepcopy(doc)
            return None


def _json_encode(v) -> str:
    return msgspec.json.encode(v).decode()


def _retried(fn):
    """A read (or put_if_absent) that meets a lost connection is tried again for a few seconds
    (a PostgreSQL restart takes about one): the pool replaces the broken connection. After
    that the error goes up (the gateway answers 503). ``commit`` is not wrapped: the projector
    retries it, and shows the outage in its status while it does."""
    from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential_jitter

    from .supervise import is_transient

    return retry(retry=retry_if_exception(is_transient), stop=stop_after_delay(READ_RETRY_S), reraise=True,
                 wait=wait_exponential_jitter(multiplier=0.05, max=0.5, jitter=0.05))(fn)


#: how long a read keeps trying through a lost PostgreSQL connection
READ_RETRY_S = 5.0


class PostgresStore:
    """The same contract in PostgreSQL, in the schema named after the service."""

    def __init__(self, dsn: str, schema: str, pool_size: int = 4):
        if not schema.replace("_", "").isalnum():
            raise ValueError(f"schema name {schema!r} must be letters, digits or _")
        self.dsn = dsn
        self.schema = schema
        self.pool_size = pool_size
        self.pool = None

    async def open(self) -> "PostgresStore":
        """Create the schema and tables (idempotent) and the pool; tried again while PostgreSQL
        is away or starting (``retry_transient``), so a service started beside it does not exit."""
        from .supervise import retry_transient

        return await retry_transient(f"opening the {self.schema} store", self._open)

    async def _open(self) -> "PostgresStore":
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema}")
            await conn.execute(f"SET search_path TO {self.schema}")
            await conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version text PRIMARY KEY)")
            done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            for path in sorted(Path(MIGRATIONS).glob("*.sql")):
                if path.stem not in done:
                    async with conn.transaction():
                        await conn.execute(path.read_text())
                        await conn.execute("INSERT INTO schema_migrations VALUES ($1) ON CONFLICT DO NOTHING",
                                           path.stem)
        finally:
            await conn.close()

        async def init(conn):
            await conn.set_type_codec("jsonb", encoder=_json_encode, decoder=msgspec.json.decode,
                                      schema="pg_catalog")

        async def reset(conn):
            # the stores keep no session state (no LISTEN, cursors, advisory locks or SETs), so
            # the pool's default reset query on every release (a round trip) is skipped; an
            # open transaction is still rolled back by asyncpg itself
            return None

        from .telemetry import instrument_asyncpg

        instrument_asyncpg()  # a span per query inside a traced request or message (once per process)
        self.pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.pool_size, init=init,
                                              reset=reset, server_settings={"search_path": self.schema})
        return self

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
            self.pool = None

    @_retried
    async def last_seq(self, consumer: str) -> int:
        v = await self.pool.fetchval("SELECT stream_seq FROM offsets WHERE consumer = $1", consumer)
        return v or 0

    async def commit(self, consumer: str, seq: int, changes: Changes, expect_at_least: int = 0) -> bool:
        """Store ``changes`` and ``seq`` at once; False (nothing changed) when ``seq`` is not past
        the stored one. ``expect_at_least``: the sequence this writer stored last; a store
        holding less went back in time (``StoreBehind``)."""
        async with self.pool.acquire() as conn, conn.transaction():
            # the row lock serialises concurrent commits of one consumer
            cur = await conn.fetchval("SELECT stream_seq FROM offsets WHERE consumer = $1 FOR UPDATE", consumer)
            if (cur or 0) < expect_at_least:
                raise StoreBehind(consumer, cur or 0, expect_at_least)
            if cur is not None and seq <= cur:
                return False
            puts = [(k, key, doc) for (k, key), doc in changes.puts.items() if doc is not None]
            dels = [(k, key) for (k, key), doc in changes.puts.items() if doc is None]
            if puts:
                await conn.executemany(
                    "INSERT INTO records (kind, key, doc) VALUES ($1, $2, $3) "
                    "ON CONFLICT (kind, key) DO UPDATE SET doc = EXCLUDED.doc", puts)
            if dels:
                await conn.executemany("DELETE FROM records WHERE kind = $1 AND key = $2", dels)
            if changes.appends:
                await conn.executemany("INSERT INTO journal (kind, key, doc) VALUES ($1, $2, $3)", changes.appends)
            await conn.execute(
                "INSERT INTO offsets (consumer, stream_seq) VALUES ($1, $2) "
                "ON CONFLICT (consumer) DO UPDATE SET stream_seq = EXCLUDED.stream_seq", consumer, seq)
            return True

    @_retried
    async def get(self, kind: str, key: str) -> dict | None:
        return await self.pool.fetchval("SELECT doc FROM records WHERE kind = $1 AND key = $2", kind, key)

    @_retried
    async def get_many(self, kind: str, keys: list[str]) -> dict[str, dict]:
        rows = await self.pool.fetch("SELECT key, doc FROM records WHERE kind = $1 AND key = ANY($2::text[])",
                                     kind, keys)
        return {r["key"]: r["doc"] for r in rows}

    @_retried
    async def scan(self, kind: str, prefix: str = "") -> list[tuple[str, dict]]:
        rows = await self.pool.fetch(
            "SELECT key, doc FROM records WHERE kind = $1 AND starts_with(key, $2) ORDER BY key", kind, prefix)
        return [(r["key"], r["doc"]) for r in rows]

    @_retried
    async def journal(self, kind: str, key: str, skip: int = 0) -> list[dict]:
        """The entries of (kind, key) in the order they were appended, after the first ``skip``."""
        rows = await self.pool.fetch("SELECT doc FROM journal WHERE kind = $1 AND key = $2 ORDER BY n OFFSET $3",
                                     kind, key, skip)
        return [r["doc"] for r in rows]

    @_retried
    async def journal_page(self, kind: str, key: str, limit: int, before_seq: int | None = None
                           ) -> tuple[list[dict], bool]:
        """The last ``limit`` entries of (kind, key) whose ``seq`` (an integer that grows with
        each append) is below ``before_seq`` (None: all), in the order appended, and whether
        older ones remain: read from the newest back (the (kind, key, n) index), not the whole
        journal."""
        rows = await self.pool.fetch(
            "SELECT doc FROM journal WHERE kind = $1 AND key = $2 AND ($3::bigint IS NULL OR (doc->>'seq')::bigint < $3)"
            " ORDER BY n DESC LIMIT $4", kind, key, before_seq, limit + 1)
        return [r["doc"] for r in reversed(rows[:limit])], len(rows) > limit

    @_retried
    async def put_if_absent(self, kind: str, key: str, doc: dict) -> dict | None:
        async with self.pool.acquire() as conn, conn.transaction():
            inserted = await conn.fetchval(
                "INSERT INTO records (kind, key, doc) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING RETURNING 1",
                kind, key, doc)
            if inserted:
                return None
            return await conn.fetchval("SELECT doc FROM records WHERE kind = $1 AND key = $2", kind, key)


def make_store(database_url: str, schema: str):
    if database_url == "memory":
        return MemoryStore()
    return PostgresStore(database_url, schema)
