"""The simulator's gateway: it authenticates tenants and reports through the tap, as a real one would.

What an API gateway (Envoy, Kong, nginx, a home-made one) does in front of shared inference:
it knows each caller's tenant from its API key, refuses unknown keys, and sets the tenant
header (``X-Tenant-Id``) on the request it passes on, replacing any the caller sent. Here the
next hop is ``bleedwatch tap`` (``service/tap/``) in the same process, which forwards to the
engine and fingerprints every answer; so the demo and the tests run the product's own path,
and this module holds no fingerprinting of its own. It reads the deployment and node of each
answer from the engine's ``x-sim-deployment`` and ``x-sim-node`` headers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import httpx
from pydantic import SecretStr
from starlette.types import Receive, Scope, Send

from service.tap.proxy import Tap, TapStats, error_body
from service.tap.settings import TapSettings

TENANT_HEADER = "x-tenant-id"


class Gateway:
    """ASGI: authenticate by API key, set the tenant header, hand the request to the tap."""

    def __init__(self, tap: Tap, tenants: Mapping[str, str]) -> None:
        self.tap = tap
        self.tenants = {k: v.encode() for k, v in tenants.items()}
        self._header = tap.settings.tenant_header.encode()

    @property
    def stats(self) -> TapStats:
        return self.tap.stats

    async def flush(self) -> None:
        """Send what is queued for bleedwatch now (tests and shutdown; otherwise it flushes itself)."""
        await self.tap.flush()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Gateway]:
        async with self.tap.running():
            yield self

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.tap(scope, receive, send)  # the lifespan starts and stops the tap
            return
        if scope["path"] == "/healthz":
            await _send(send, 200, b'{"status":"ok"}')
            return
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), b"").decode("latin-1")
        scheme, _, token = authorization.partition(" ")
        tenant = self.tenants.get(token.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            await _send(send, 401, error_body(401, "invalid_api_key", "Incorrect API key provided."))
            return
        headers = [(k, v) for k, v in scope["headers"] if k != self._header] + [(self._header, tenant)]
        await self.tap({**scope, "headers": headers}, receive, send)


async def _send(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def create_gateway(
    *,
    upstream_url: str,
    tenants: Mapping[str, str],
    bleedwatch_url: str,
    bleedwatch_api_key: str,
    fingerprint_key: bytes,
    deployment: str | None = None,
    flush_seconds: float = 0.5,
    max_attempts: int = 8,
    fingerprint_workers: int = 1,
    upstream_transport: httpx.AsyncBaseTransport | None = None,
    bleedwatch_transport: httpx.AsyncBaseTransport | None = None,
) -> Gateway:
    """The gateway app (``tenants`` maps API key to tenant); run it with ``running()`` or an ASGI server."""
    settings = TapSettings(
        upstream_url=upstream_url,
        tenant_header=TENANT_HEADER,
        deployment=deployment,
        deployment_header=None if deployment else "x-sim-deployment",
        node_header="x-sim-node",
        bleedwatch_url=bleedwatch_url,
        bleedwatch_api_key=SecretStr(bleedwatch_api_key),
        fingerprint_key=SecretStr(fingerprint_key.hex()),
        flush_seconds=flush_seconds,
        fingerprint_workers=fingerprint_workers,
        metrics_port=None,  # no metrics port: several run side by side
    )
    tap = Tap(
        settings,
        upstream_transport=upstream_transport,
        bleedwatch_transport=bleedwatch_transport,
        bleedwatch_max_attempts=max_attempts,
    )
    return Gateway(tap, tenants)
