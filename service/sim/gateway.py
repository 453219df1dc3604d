"""A gateway shim: the pattern a real gateway integration follows.

It sits between tenants and an OpenAI-compatible upstream, knows each caller's tenant from
its API key, passes requests and answers through unchanged (streamed answers as they stream),
and once an answer is complete fingerprints the exchange with the SDK
(``BleedwatchClient.submit_text``: hashing in a worker thread, batching, retries) and ships
the fingerprints to bleedwatch with where it was served: deployment, node and the engine's
prompt token count. This module is the only place outside the engine where text exists; it
never logs it, and bleedwatch failures never reach the tenant.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import httpx
import orjson
from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from bleedwatch.client import BleedwatchClient, Rejected, Undelivered
from bleedwatch.exchange import Scalar
from service.sim import openai_wire as wire

log = logging.getLogger("bleedwatch.gateway")

PASSED_HEADERS = ("x-sim-deployment", "x-sim-node", "x-request-id")


@dataclass(slots=True)
class GatewayStats:
    forwarded: int = 0
    submitted: int = 0
    upstream_errors: int = 0
    submit_errors: int = 0


class Gateway:
    def __init__(
        self,
        *,
        upstream_url: str,
        tenants: Mapping[str, str],
        bleedwatch: BleedwatchClient,
        fingerprint_key: bytes,
        deployment: str | None = None,
        upstream_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.tenants = dict(tenants)
        self.bleedwatch = bleedwatch
        self.stats = GatewayStats()
        self._key = fingerprint_key
        self._deployment = deployment
        self._upstream = httpx.AsyncClient(
            base_url=upstream_url.rstrip("/"), timeout=httpx.Timeout(60.0, connect=5.0), transport=upstream_transport
        )

    async def aclose(self) -> None:
        await self._upstream.aclose()

    async def flush(self) -> None:
        """Send what is queued for bleedwatch now (tests and shutdown; otherwise it flushes itself)."""
        await self.bleedwatch.flush()

    async def submit(
        self, tenant: str, prompt: str, answer: str, request_id: str | None, model: str, served: Mapping[str, Any]
    ) -> None:
        if not request_id:
            return
        meta: dict[str, Scalar] = {
            "deployment": self._deployment or served.get("x-sim-deployment"),
            "node": served.get("x-sim-node"),
            "prompt_tokens": served.get("prompt_tokens"),
        }
        try:
            await self.bleedwatch.submit_text(
                prompt,
                answer,
                key=self._key,
                tenant=tenant,
                request_id=request_id,
                model=model,
                ts=time.time(),
                meta={k: v for k, v in meta.items() if v is not None},
            )
            self.stats.submitted += 1
        except Exception as exc:  # the tenant's answer is already on its way; bleedwatch must not break it
            self.stats.submit_errors += 1
            log.error("could not ship an exchange to bleedwatch: %s", type(exc).__name__)

    async def forward(self, tenant: str, authorization: str, raw: bytes, body: wire.ChatRequest) -> Response:
        self.stats.forwarded += 1
        headers = {"Authorization": authorization, "Content-Type": "application/json"}
        prompt = wire.prompt_text(body.messages)
        if not body.stream:
            try:
                resp = await self._upstream.post("/v1/chat/completions", content=raw, headers=headers)
            except httpx.HTTPError:
                self.stats.upstream_errors += 1
                return JSONResponse(wire.error_body("upstream unreachable", "bad_gateway", "api_error"), 502)
            out = Response(resp.content, resp.status_code, media_type=resp.headers.get("content-type"))
            _copy_headers(resp, out)
            data = _json(resp) if resp.status_code == 200 else None
            if data is not None:
                content = ((data.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
                served = _served(resp, data.get("usage"))
                await self.submit(tenant, prompt, content, data.get("id"), data.get("model") or body.model, served)
            return out
        # Streaming: ask the upstream for usage (the engine's prompt token count), hide it from
        # a client that did not ask for it.
        wants_usage = body.stream_options is not None and body.stream_options.include_usage
        upstream_body = orjson.loads(raw)
        upstream_body["stream_options"] = {**(upstream_body.get("stream_options") or {}), "include_usage": True}
        request = self._upstream.build_request(
            "POST", "/v1/chat/completions", content=orjson.dumps(upstream_body), headers=headers
        )
        try:
            resp = await self._upstream.send(request, stream=True)
        except httpx.HTTPError:
            self.stats.upstream_errors += 1
            return JSONResponse(wire.error_body("upstream unreachable", "bad_gateway", "api_error"), 502)
        if resp.status_code != 200:
            content = await resp.aread()
            await resp.aclose()
            out = Response(content, resp.status_code, media_type=resp.headers.get("content-type"))
            _copy_headers(resp, out)
            return out

        async def relay() -> AsyncIterator[bytes]:
            reader = wire.StreamReader()
            try:
                async for line in resp.aiter_lines():
                    chunk = reader.feed(line)
                    if not line.strip():
                        continue
                    if chunk is not None and not chunk.get("choices") and chunk.get("usage") and not wants_usage:
                        continue
                    yield line.encode() + b"\n\n"
            finally:
                await resp.aclose()
            if reader.done:
                served = _served(resp, reader.usage)
                await self.submit(tenant, prompt, reader.content, reader.request_id, reader.model or body.model, served)

        out = StreamingResponse(relay(), media_type="text/event-stream")
        _copy_headers(resp, out)
        return out


def _json(resp: httpx.Response) -> dict[str, Any] | None:
    try:
        data = resp.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _served(resp: httpx.Response, use: Any) -> dict[str, Any]:
    served: dict[str, Any] = {h: resp.headers[h] for h in PASSED_HEADERS if h in resp.headers}
    if isinstance(use, dict) and isinstance(use.get("prompt_tokens"), int):
        served["prompt_tokens"] = use["prompt_tokens"]
    return served


def _copy_headers(resp: httpx.Response, out: Response) -> None:
    for h in PASSED_HEADERS:
        if h in resp.headers:
            out.headers[h] = resp.headers[h]


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
    upstream_transport: httpx.AsyncBaseTransport | None = None,
    bleedwatch_transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """The gateway app; ``app.state.gateway`` is its ``Gateway`` once the lifespan has started."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = BleedwatchClient(
            bleedwatch_url,
            bleedwatch_api_key,
            flush_seconds=flush_seconds,
            max_attempts=max_attempts,
            transport=bleedwatch_transport,
        )
        await client.__aenter__()
        gateway = Gateway(
            upstream_url=upstream_url,
            tenants=tenants,
            bleedwatch=client,
            fingerprint_key=fingerprint_key,
            deployment=deployment,
            upstream_transport=upstream_transport,
        )
        app.state.gateway = gateway
        try:
            yield
        finally:
            try:
                await client.aclose()  # the last flush
            except (Rejected, Undelivered) as exc:
                log.error("exchanges not delivered to bleedwatch at shutdown: %s", exc)
            await gateway.aclose()

    app = FastAPI(title="bleedwatch gateway shim", lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request, authorization: Annotated[str | None, Header()] = None) -> Response:
        gateway: Gateway = request.app.state.gateway
        scheme, _, token = (authorization or "").partition(" ")
        tenant = gateway.tenants.get(token.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            return JSONResponse(
                wire.error_body("Incorrect API key provided.", "invalid_api_key", "authentication_error"), 401
            )
        raw = await request.body()
        try:
            body = wire.ChatRequest.model_validate_json(raw)
        except ValueError:
            return JSONResponse(wire.error_body("the body is not a chat completion request", "invalid_request"), 400)
        return await gateway.forward(tenant, authorization or "", raw, body)

    return app
