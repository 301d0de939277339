"""Composition root of the executor: ``python -m services.executor``.

Settings, the cluster, the clock, the service, and the faststream broker carrying its
request/reply handlers (``handlers.py``) are wired here and nowhere else.
"""

from __future__ import annotations

from ..common import http_health
from ..common.broker import make_broker
from ..common.clock import make_clock
from ..common.cluster_config import ClusterConfig, load_cluster
from ..common.runner import setup_logging, wait_for_signal
from ..common.settings import Settings
from .handlers import router
from .service import Executor


async def compose(settings: Settings, config: ClusterConfig, clock, **start_kwargs) -> Executor:
    """The started service, its handlers served by a broker of its own."""
    service = Executor(settings, config, clock)
    broker = make_broker(settings, "executor", router(service, config.name))
    await service.start(broker=broker, **start_kwargs)
    return service


async def main() -> None:
    settings = Settings.from_env()
    setup_logging(settings.log_level)
    config = load_cluster(settings.cluster_file, settings.cluster)
    service = await compose(settings, config, make_clock(settings.clock))
    health_http = None
    if settings.health_port:
        health_http = await http_health.serve(service, "executor", settings.http_host, settings.health_port)
    try:
        await wait_for_signal()
    finally:
        if health_http is not None:
            health_http.close()
        await service.stop()
