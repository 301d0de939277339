"""Composition helpers: logging, settings, signals; ``run(main)`` for ``python -m services.<name>``."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("nats", "uvicorn.access", "asyncio", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


async def wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def run(main) -> None:
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
