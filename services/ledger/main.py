"""Composition root of the ledger: ``python -m services.ledger``.

The service and the faststream broker carrying its request/reply handlers (``handlers.py``)
are wired here and nowhere else; ``runner.serve`` gives it settings, cluster and clock.
"""

from __future__ import annotations

from ..common.broker import make_broker
from ..common.cluster_config import ClusterConfig
from ..common.runner import serve
from ..common.settings import Settings
from .handlers import router
from .service import Ledger


async def compose(settings: Settings, config: ClusterConfig, clock, **start_kwargs) -> Ledger:
    """The started service, its handlers served by a broker of its own."""
    service = Ledger(settings, config, clock)
    broker = make_broker(settings, "ledger", router(service, config.name))
    await service.start(broker=broker, **start_kwargs)
    return service


async def main() -> None:
    await serve("ledger", compose)
