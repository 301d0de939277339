"""Composition root of the gateway: ``python -m services.gateway`` (``runner.serve`` gives it
settings, cluster and clock; it serves HTTP, its ``/healthz`` included)."""

from __future__ import annotations

from ..common.cluster_config import ClusterConfig
from ..common.runner import serve
from ..common.settings import Settings
from .service import Gateway


async def compose(settings: Settings, config: ClusterConfig, clock) -> Gateway:
    service = await Gateway(settings, config, clock).start()
    print(f"timeshare gateway for cluster {config.name} on {service.url}", flush=True)
    return service


async def main() -> None:
    await serve("gateway", compose, health_http=False)
