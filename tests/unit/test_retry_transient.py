"""Start-up steps are tried again through a server that is away, and only then."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from services.common.supervise import retry_transient


def test_a_step_that_times_out_is_tried_again_until_it_succeeds(caplog):
    calls = []

    async def step():
        calls.append(1)
        if len(calls) < 3:
            raise nats.errors.TimeoutError  # a JetStream request during a leader election
        return "snapshot"

    assert asyncio.run(retry_transient("reading the snapshot", step)) == "snapshot"
    assert len(calls) == 3
    assert sum("reading the snapshot failed" in r.message for r in caplog.records) == 2


def test_an_error_that_retrying_cannot_cure_goes_up_at_once():
    calls = []

    async def step():
        calls.append(1)
        raise RuntimeError("the log is purged and its snapshot is gone")

    with pytest.raises(RuntimeError, match="purged"):
        asyncio.run(retry_transient("reading the snapshot", step))
    assert len(calls) == 1


def test_it_gives_up_after_its_time():
    async def step():
        raise ConnectionRefusedError

    with pytest.raises(ConnectionRefusedError):
        asyncio.run(retry_transient("opening the store", step, within_s=0.3))
