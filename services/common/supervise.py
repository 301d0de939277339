"""Long-running tasks that never die silently, and which failures are worth retrying.

``supervise(name, factory, stop)`` runs ``await factory()`` again whenever it fails (logged with
its traceback) or returns while the service is still running, waiting a little longer after
each failure in a row (exponential, capped), and resets that wait once a run has lasted a
while. ``is_transient(exc)`` tells a lost connection (NATS or PostgreSQL: retry it) from a
record that can never be stored (dead-letter it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

import nats.errors

log = logging.getLogger("timeshare.supervise")

#: PostgreSQL error classes that mean "the server or the connection", not "this data":
#: 08 connection exception, 53 insufficient resources, 57P operator intervention (shutdown,
#: cannot connect now), 40 transaction rollback (serialization failure, deadlock)
_TRANSIENT_SQLSTATE = ("08", "53", "57P", "40", "55P03")


def is_transient(exc: BaseException) -> bool:
    """True for a failure that retrying later can cure (a server away, a connection lost)."""
    try:
        import asyncpg
    except ImportError:  # pragma: no cover - services always have it
        asyncpg = None
    if isinstance(exc, (OSError, ConnectionError, asyncio.TimeoutError, TimeoutError)):
        return True
    if getattr(exc, "transient", False):  # e.g. bus.InfraMissing: the operator's setup comes
        return True
    if isinstance(exc, nats.errors.Error) and not isinstance(exc, nats.errors.BadSubjectError):
        return True
    if asyncpg is not None:
        if isinstance(exc, asyncpg.exceptions.PostgresError):
            state = getattr(exc, "sqlstate", "") or ""
            return state.startswith(_TRANSIENT_SQLSTATE)
        if isinstance(exc, (asyncpg.InterfaceError, asyncpg.exceptions.InternalClientError)):
            return True
    return False


def describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def supervise(name: str, factory: Callable[[], Awaitable[None]], stop: asyncio.Event,
                    initial_wait_s: float = 0.1, max_wait_s: float = 5.0, healthy_after_s: float = 30.0,
                    on_error: Callable[[BaseException], None] | None = None,
                    restart_on_return: bool = True) -> None:
    """Run ``factory()`` until ``stop`` is set, restarting it after a failure or an early return
    (with ``restart_on_return=False`` a return ends the supervision: the caller loops)."""
    wait_s = initial_wait_s
    while not stop.is_set():
        started = time.monotonic()
        try:
            await factory()
            if stop.is_set() or not restart_on_return:
                return
            log.warning("%s ended while the service runs; restarting it", name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the point is to outlive it
            if stop.is_set():
                return
            if on_error is not None:
                on_error(exc)
            log.error("%s failed (%s); restarting in %.1fs", name, describe(exc), wait_s,
                      exc_info=not is_transient(exc))
        if time.monotonic() - started > healthy_after_s:
            wait_s = initial_wait_s
        try:
            await asyncio.wait_for(stop.wait(), wait_s)
        except asyncio.TimeoutError:
            pass
        wait_s = min(max_wait_s, wait_s * 2)


def spawn(name: str, factory: Callable[[], Awaitable[None]], stop: asyncio.Event, **kwargs) -> asyncio.Task:
    """``supervise`` as a named task."""
    return asyncio.create_task(supervise(name, factory, stop, **kwargs), name=name)


#: how long a start-up step keeps trying through a server that is away or not ready (a NATS
#: cluster electing a stream leader answers "no responders" or times out for a few seconds)
START_RETRY_S = 60.0


async def retry_transient(what: str, fn: Callable[[], Awaitable], within_s: float = START_RETRY_S):
    """``await fn()``, tried again with backoff while it fails for a transient reason (logged
    once per try), for up to ``within_s``; then the error goes up. For idempotent start-up steps
    (creating streams, reading a snapshot): a service started while its servers recover must
    not exit on the first timeout. (Seen: the executor, started as a three-node NATS cluster
    elected a new log leader, exited on one object-store timeout and nothing completed after.)"""
    from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

    async for attempt in AsyncRetrying(
            retry=retry_if_exception(is_transient), stop=stop_after_delay(within_s), reraise=True,
            wait=wait_exponential_jitter(multiplier=0.1, max=2.0, jitter=0.1),
            before_sleep=lambda rs: log.warning("%s failed (%s); trying again", what,
                                                describe(rs.outcome.exception()))):
        with attempt:
            return await fn()
