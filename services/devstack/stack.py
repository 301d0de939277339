"""Every service of one cluster in one process (the devstack, the integration tests, the bench).

Each service is also runnable on its own (``python -m services.<name>``); this only saves
processes on a laptop. They share one NATS connection per service, like separate processes.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import replace

from ..common.clock import make_clock
from ..common.cluster_config import ClusterConfig, load_cluster
from ..common.settings import Settings

log = logging.getLogger("timeshare.devstack")

SERVICES = {
    "placement": "services.placement.service:Placement",
    "executor": "services.executor.service:Executor",
    "budget": "services.budget.service:Budget",
    "ledger": "services.ledger.service:Ledger",
    "health": "services.health.service:Health",
    "gateway": "services.gateway.service:Gateway",
}
ORDER = ("placement", "budget", "ledger", "health", "executor", "gateway")


def _cls(name: str):
    mod, _, attr = SERVICES[name].partition(":")
    return getattr(importlib.import_module(mod), attr)


class Stack:
    def __init__(self, settings: Settings, config: ClusterConfig | None = None, clock=None,
                 services: tuple[str, ...] = ORDER):
        self.settings = settings
        self.config = config or load_cluster(settings.cluster_file, settings.cluster)
        if not settings.cluster:
            self.settings = replace(settings, cluster=self.config.name)
        self.clock = clock or make_clock(settings.clock)
        self.names = [n for n in ORDER if n in services]
        self.services: dict[str, object] = {}

    async def start(self, echo=None) -> "Stack":
        """Start every service in order; ``echo(text)`` hears about each one (the devstack prints)."""
        import time

        try:
            await self.setup_infra()
            for name in self.names:
                t0 = time.monotonic()
                if echo:
                    echo(f"  starting {name} ...")
                await self.start_service(name)
                if echo:
                    echo(f"  {name} ready ({time.monotonic() - t0:.1f}s)")
        except BaseException:
            await self.stop()  # nothing half-started is left behind
            raise
        return self

    async def setup_infra(self) -> None:
        """The operator's step first (``python -m services.admin setup``): services only bind to
        the streams, durables and buckets. Skipped without the operator's password (its
        services then wait for an operator to run it)."""
        from ..admin.setup import setup
        from ..common import nats_auth

        creds = self.settings.nats_credential_table()
        if not creds or nats_auth.OPERATOR in creds:
            await setup(self.settings, [self.settings.cluster])

    async def start_service(self, name: str):
        main = importlib.import_module(f"services.{name}.main")
        if hasattr(main, "compose"):  # the service's composition root (with its faststream handlers)
            svc = await main.compose(self.settings, self.config, self.clock)
        else:
            svc = _cls(name)(self.settings, self.config, self.clock)
            await svc.start()
        self.services[name] = svc
        return svc

    async def stop_service(self, name: str, **kwargs) -> None:
        svc = self.services.pop(name, None)
        if svc is not None:
            await svc.stop(**kwargs)

    async def stop(self) -> None:
        for name in reversed(list(self.services)):
            try:
                await self.stop_service(name)
            except Exception as exc:  # keep stopping the others
                log.warning("stopping %s: %s", name, exc)

    def __getitem__(self, name: str):
        return self.services[name]
