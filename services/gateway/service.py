"""The gateway service: its projection consumer plus the HTTP server (uvicorn)."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from ..common.auth import TokenTable
from ..common.bus import Bus
from ..common.cluster_config import ClusterConfig
from ..common.projector import Projector
from ..common.settings import Settings
from ..common.store import make_store
from ..common.telemetry import setup_metrics, setup_telemetry
from . import slow_clients
from .app import create_app
from .projection import Projection

log = logging.getLogger("timeshare.gateway")


class Gateway:
    def __init__(self, settings: Settings, config: ClusterConfig, clock, bus: Bus | None = None, store=None):
        self.settings = settings
        self.config = config
        self.cluster = config.name
        self.cluster_model = config.cluster()
        self.clock = clock
        self.bus = bus
        self.own_bus = bus is None
        self.store = store or make_store(settings.database_url, "gateway")
        self.tokens = TokenTable(settings.token_table())
        self.projection: Projection | None = None
        self.projector: Projector | None = None
        self.stop_event = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.server: uvicorn.Server | None = None
        self.app = None
        self.tracer = setup_telemetry("gateway", settings.otel)
        setup_metrics("gateway", settings.otel)  # the meter provider of a gateway on its own (HTTP metrics)

    @property
    def url(self) -> str:
        scheme = "https" if self.settings.http_tls_cert else "http"
        return f"{scheme}://{self.settings.http_host}:{self.settings.http_port}"

    async def start(self, serve_http: bool = True) -> "Gateway":
        if self.bus is None:
            # nothing buffered across a disconnect: a 503 means "not done" (gateway/publish.py)
            self.bus = await Bus.connect(self.settings, self.cluster, name="gateway", buffer_while_disconnected=False)
        await self.bus.ensure_infra()
        await self.store.open()
        self.projection = Projection(f"gateway-{self.cluster}", self.config.tree())
        await self.projection.load(self.store)
        self.projector = await Projector(self.projection, self.bus, self.store, self.stop_event,
                                         stuck_after_s=self.settings.stuck_after_s).start()
        self.app = create_app(self)
        if serve_http:
            cfg = uvicorn.Config(self.app, host=self.settings.http_host, port=self.settings.http_port,
                                 log_level="warning", access_log=False, lifespan="off",
                                 # a request's headers and body arrive within this (slow sockets)
                                 http=slow_clients.protocol(self.settings.http_read_timeout_s),
                                 ssl_certfile=self.settings.http_tls_cert or None,
                                 ssl_keyfile=self.settings.http_tls_key or None)
            self.server = uvicorn.Server(cfg)
            self.server.install_signal_handlers = lambda: None
            self.tasks.append(asyncio.create_task(self.server.serve()))
            while not self.server.started:
                await asyncio.sleep(0.01)
                if self.tasks[-1].done():
                    self.tasks[-1].result()
        return self

    async def stop(self) -> None:
        self.stop_event.set()
        if self.server is not None:
            self.server.should_exit = True
        if self.projector is not None:
            await self.projector.close()
        for t in self.tasks:
            try:
                await asyncio.wait_for(t, 3)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):
                t.cancel()
        await self.store.close()
        if self.own_bus:
            await self.bus.close()
