"""Composition helpers: logging, settings, signals; ``run(main)`` for ``python -m services.<name>``."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("nats", "uvicorn.access", "asyncio", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


async def wait_for_signal(stop_within_s: float = 8.0) -> None:
    """Return on SIGINT or SIGTERM. From then on the caller has ``stop_within_s`` to stop: a
    stop that hangs (seen once: a placement that never exited after SIGTERM and went on
    refreshing its lease) ends the process instead, logged, so nothing outlives its parent's
    stop with a lease or a subscription of its own."""
    freeze_startup_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    received: list[int] = []

    def on_signal(sig: int) -> None:
        received.append(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    await stop.wait()
    logging.getLogger("timeshare.runner").info("%s: stopping", signal.Signals(received[0]).name)

    def give_up() -> None:
        logging.getLogger("timeshare.runner").error("did not stop within %.0f s of the signal: exiting", stop_within_s)
        logging.shutdown()
        os._exit(1)

    loop.call_later(stop_within_s, give_up)


def freeze_startup_heap() -> None:
    """The service is up: what it allocated to get here (imported modules, the state it
    loaded) lives as long as the process. ``gc.freeze`` moves it out of the cyclic collector's
    reach, so a full collection scans only what came after (Instagram's remedy for the same
    pauses). In ``make bench-live`` full collections held the services' event loops for
    40-110 ms each, dozens of times a run: the decision latency's tail."""
    gc.collect()
    gc.freeze()


def event_loop_factory():
    """uvloop's event loop when it is installed (`pip install uvloop`: about twice the message and
    HTTP throughput), else asyncio's. uvicorn likewise uses httptools when it is installed."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_async(coro):
    """``asyncio.run`` on the fastest event loop available."""
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(coro)


async def serve(name: str, compose, *, health_http: bool = True, **compose_kwargs) -> None:
    """The life of ``python -m services.<name>``: settings from the environment, logging, the
    cluster and the clock; the service started by ``compose(settings, config, clock,
    **compose_kwargs)`` (its composition root, ``<name>/main.py``, which the devstack and the
    tests call too); ``GET /healthz`` over HTTP when ``TIMESHARE_HEALTH_PORT`` asks (not for
    the gateway, ``health_http=False``: it serves ``/healthz`` on its own port); then, on SIGINT
    or SIGTERM, the stop."""
    from . import http_health
    from .clock import make_clock
    from .cluster_config import load_cluster
    from .settings import Settings

    settings = Settings.from_env()
    setup_logging(settings.log_level)
    config = load_cluster(settings.cluster_file, settings.cluster)
    service = await compose(settings, config, make_clock(settings.clock), **compose_kwargs)
    server = None
    if health_http and settings.health_port:
        server = await http_health.serve(service, name, settings.http_host, settings.health_port)
    try:
        await wait_for_signal()
    finally:
        if server is not None:
            server.close()
        await service.stop()


def run(main) -> None:
    try:
        run_async(main())
    except KeyboardInterrupt:
        pass
