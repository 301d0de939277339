"""Composition root of health: ``python -m services.health``."""

from __future__ import annotations

from ..common.clock import make_clock
from ..common.cluster_config import load_cluster
from ..common.runner import setup_logging, wait_for_signal
from ..common.settings import Settings
from .service import Health


async def main() -> None:
    settings = Settings.from_env()
    setup_logging(settings.log_level)
    config = load_cluster(settings.cluster_file, settings.cluster)
    service = await Health(settings, config, make_clock(settings.clock)).start()
    try:
        await wait_for_signal()
    finally:
        await service.stop()
