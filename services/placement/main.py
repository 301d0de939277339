"""Composition root of placement: ``python -m services.placement``.

The service and the faststream broker carrying its request/reply handlers (``handlers.py``)
are wired here and nowhere else; ``runner.serve`` gives it settings, cluster and clock.
"""

from __future__ import annotations

from ..common.broker import make_broker
from ..common.cluster_config import ClusterConfig
from ..common.runner import serve
from ..common.settings import Settings
from .handlers import router
from .service import Placement


async def compose(settings: Settings, config: ClusterConfig, clock, **start_kwargs) -> Placement:
    """The started service, its handlers served by a broker of its own."""
    service = Placement(settings, config, clock)
    broker = make_broker(settings, f"placement-{service.instance}", router(service, config.name))
    await service.start(broker=broker, **start_kwargs)
    return service


async def main() -> None:
    await serve("placement", compose, wait_leader=False)
