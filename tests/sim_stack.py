"""The simulator's whole stack in one event loop, over in-process ASGI transports.

Tenants -> gateway (auth, then the tap) -> engine front (buggy or fixed) -> engine; the gateway ships
fingerprints and the engine its config and signals to bleedwatch, which runs on the test's
backend (``settings``). Nothing flushes by itself: tests call ``stack.flush()``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from service.app import create_app
from service.auth.keys import Role
from service.config import Settings
from service.migrate import upgrade
from service.tools.sim.engine import Engine, EngineConfig
from service.tools.sim.front import create_front, sim_keys
from service.tools.sim.gateway import Gateway, create_gateway
from service.tools.sim.reporter import Reporter
from service.tools.sim.traffic import Planned, Sent, send
from tests.conftest import Api, _create_keys
from tests.traffic import KEY

BLEEDWATCH = "http://bleedwatch.test"
NEVER = 3600.0


@asynccontextmanager
async def bleedwatch(settings: Settings) -> AsyncIterator[tuple[Api, httpx.ASGITransport]]:
    """Like conftest's ``api``, also handing out the transport, for the gateway and the engine."""
    if settings.database_url is None:
        upgrade(settings)
    tokens = await _create_keys(settings)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BLEEDWATCH) as client:
            yield Api(client, tokens, app), transport


@dataclass
class Stack:
    api: Api
    engine: Engine
    reporter: Reporter
    gateway: Gateway
    client: httpx.AsyncClient  # a tenant's view: the gateway
    keys: dict[str, str]  # tenant -> API key

    async def send(self, planned: Sequence[Planned]) -> list[Sent]:
        return await send(self.client, planned, self.engine.config.model, self.keys)

    async def flush(self) -> None:
        await self.gateway.flush()
        await self.reporter.flush()
        await self.api.processed()


@asynccontextmanager
async def sim_stack(
    settings: Settings, config: EngineConfig, tenants: list[str] | tuple[str, ...]
) -> AsyncIterator[Stack]:
    async with bleedwatch(settings) as (api, transport):
        reporter = Reporter(
            BLEEDWATCH,
            admin_key=api.tokens[Role.ADMIN],
            ingest_key=api.tokens[Role.INGEST],
            flush_seconds=NEVER,
            transport=transport,
        )
        engine = Engine(config, on_signal=reporter.signal)
        keys = sim_keys(tenants)
        front = create_front(engine, keys, reporter)
        async with front.router.lifespan_context(front):
            gateway = create_gateway(
                upstream_url="http://engine.test",
                tenants=keys,
                bleedwatch_url=BLEEDWATCH,
                bleedwatch_api_key=api.tokens[Role.INGEST],
                fingerprint_key=KEY,
                flush_seconds=NEVER,
                fingerprint_workers=0,
                upstream_transport=httpx.ASGITransport(app=front),
                bleedwatch_transport=transport,
            )
            async with gateway.running():
                tenant_side = httpx.ASGITransport(app=gateway)
                async with httpx.AsyncClient(transport=tenant_side, base_url="http://gateway.test") as client:
                    yield Stack(api, engine, reporter, gateway, client, {t: k for k, t in keys.items()})
