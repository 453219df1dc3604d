"""An OpenAI-compatible HTTP front for the simulated engine: ``POST /v1/chat/completions``.

Tenant identity comes from the API key (``Authorization: Bearer <key>``), as on a shared
inference provider. Answers are JSON, or server-sent events with ``"stream": true``; the
response headers ``x-sim-deployment`` and ``x-sim-node`` say where it was served, which is
what a gateway passes on to bleedwatch. With the bug, an over-pool prompt is answered 200 like
any other: only the content is wrong.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from service.tools.sim import openai_wire as wire
from service.tools.sim.engine import Engine, Refused
from service.tools.sim.reporter import Reporter

log = logging.getLogger("bleedwatch.sim")


def sim_keys(tenants: list[str] | tuple[str, ...]) -> dict[str, str]:
    """The simulator's default API keys: ``sk-sim-<tenant>`` for each tenant."""
    return {f"sk-sim-{t}": t for t in tenants}


def _error(status: int, message: str, code: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(wire.error_body(message, code, kind), status_code=status)


def create_front(
    engine: Engine, keys: Mapping[str, str], reporter: Reporter | None = None, chunk_delay_seconds: float = 0.0
) -> FastAPI:
    """The engine over HTTP. With a ``reporter``, the config is reported at start and signals as they occur.

    ``chunk_delay_seconds`` paces a streamed answer like a decoding engine (the first event at once,
    then one every so often); the default streams it all at once.
    """
    cfg = engine.config

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if reporter is not None:
            await reporter.start(cfg.deployment, cfg.deployment_config())
        try:
            yield
        finally:
            if reporter is not None:
                await reporter.aclose()

    app = FastAPI(title=f"bleedwatch-sim engine ({cfg.mode.value})", lifespan=lifespan)
    app.state.engine = engine

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"{where}: {first.get('msg', 'invalid')}", "invalid_request")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "mode": cfg.mode.value}

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {"object": "list", "data": [{"id": cfg.model, "object": "model", "owned_by": "bleedwatch-sim"}]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(
        body: wire.ChatRequest, authorization: Annotated[str | None, Header()] = None
    ) -> Response:
        scheme, _, token = (authorization or "").partition(" ")
        tenant = keys.get(token.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            return _error(401, "Incorrect API key provided.", "invalid_api_key", "authentication_error")
        if body.model != cfg.model:
            return _error(404, f"The model '{body.model[:64]}' does not exist; try '{cfg.model}'.", "model_not_found")
        limit = body.max_completion_tokens or body.max_tokens
        result = engine.serve(tenant, wire.prompt_text(body.messages), limit)
        if isinstance(result, Refused):
            return _error(result.status, result.message, result.code)
        if result.stale:
            # What the provider's logs said: the request was "rejected". The client still gets 200.
            log.info(
                "prefill rejected %s: %d-token prompt over the %d-token pool; decode went ahead",
                result.request_id,
                result.prompt_tokens,
                engine.nodes[0].prefill.capacity,
            )
        finish: wire.FinishReason = "length" if limit is not None and result.completion_tokens >= limit else "stop"
        use = wire.usage(result.prompt_tokens, result.completion_tokens)
        headers = {"x-sim-deployment": cfg.deployment, "x-sim-node": result.node, "x-request-id": result.request_id}
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            chunks = wire.stream_chunks(
                result.request_id, cfg.model, result.answer, finish, use if include_usage else None
            )
            return StreamingResponse(
                _aiter(chunks, chunk_delay_seconds), media_type="text/event-stream", headers=headers
            )
        return JSONResponse(wire.completion(result.request_id, cfg.model, result.answer, finish, use), headers=headers)

    return app


async def _aiter(chunks: Iterator[bytes], delay: float) -> AsyncIterator[bytes]:
    for i, chunk in enumerate(chunks):
        if delay and i:
            await asyncio.sleep(delay)
        yield chunk
