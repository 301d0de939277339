"""Composition root of placement: ``python -m services.placement``."""

from __future__ import annotations

from ..common.clock import make_clock
from ..common.cluster_config import load_cluster
from ..common.runner import run, setup_logging, wait_for_signal
from ..common.settings import Settings
from .service import Placement


async def main() -> None:
    settings = Settings.from_env()
    setup_logging(settings.log_level)
    config = load_cluster(settings.cluster_file, settings.cluster)
    service = await Placement(settings, config, make_clock(settings.clock)).start(wait_leader=False)
    try:
        await wait_for_signal()
    finally:
        await service.stop()


if __name__ == "__main__":
    run(main)
