"""Where the integration tests' servers come from (conftest.servers_from)."""

from __future__ import annotations

import os

from .conftest import docker_answers, servers_from


def test_servers_come_from_testcontainers_when_a_docker_engine_answers_else_the_local_binaries():
    forced = os.environ.get("TIMESHARE_TEST_SERVERS")
    expected = forced or ("docker" if docker_answers() else "local")
    assert servers_from() == expected


def test_no_docker_engine_is_told_apart_quickly(monkeypatch):
    import time

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    t0 = time.monotonic()
    assert docker_answers() is False
    assert time.monotonic() - t0 < 2.0
