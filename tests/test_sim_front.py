"""The simulator's OpenAI-compatible front and the gateway shim, as clients see them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import orjson
import pytest

from service.app import create_app
from service.auth.keys import Role
from service.config import Settings
from service.local_server import local_server
from service.migrate import upgrade
from service.tools.probe import canary_probe
from service.tools.sim.corpus import prompt
from service.tools.sim.engine import Engine, EngineConfig, Mode
from service.tools.sim.front import create_front, sim_keys
from service.tools.sim.gateway import create_gateway
from service.tools.sim.openai_wire import StreamReader
from tests.conftest import _create_keys
from tests.traffic import KEY

pytestmark = pytest.mark.anyio

SMALL = EngineConfig(context_length=400, prefill_pool_tokens=200, decode_pool_tokens=400)
MODEL = "sim-open-weights-1m"
ACME = {"Authorization": "Bearer sk-sim-acme"}
GLOBEX = {"Authorization": "Bearer sk-sim-globex"}


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}]} | extra


@pytest.fixture
async def front() -> AsyncIterator[tuple[Engine, httpx.AsyncClient]]:
    engine = Engine(SMALL)
    app = create_front(engine, sim_keys(["acme", "globex"]))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://e") as client:
        yield engine, client


def events(body: str) -> list[Any]:
    lines = [line for line in body.split("\n\n") if line]
    assert all(line.startswith("data: ") for line in lines)
    return [line[6:] if line[6:] == "[DONE]" else orjson.loads(line[6:]) for line in lines]


async def test_a_completion(front: tuple[Engine, httpx.AsyncClient]) -> None:
    engine, client = front
    resp = await client.post("/v1/chat/completions", json=chat(prompt("acme", 120)), headers=ACME)
    assert resp.status_code == 200
    body = resp.json()
    (served,) = engine.history.served
    assert body["id"] == served.request_id == resp.headers["x-request-id"]
    assert (body["object"], body["model"]) == ("chat.completion", MODEL)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": served.answer}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {
        "prompt_tokens": 120,
        "completion_tokens": served.completion_tokens,
        "total_tokens": 120 + served.completion_tokens,
    }
    assert (resp.headers["x-sim-deployment"], resp.headers["x-sim-node"]) == ("sim-pd-1", "decode-0")
    assert served.tenant == "acme"


async def test_a_streamed_completion(front: tuple[Engine, httpx.AsyncClient]) -> None:
    engine, client = front
    resp = await client.post("/v1/chat/completions", json=chat(prompt("acme", 120), stream=True), headers=ACME)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    got = events(resp.text)
    assert got[-1] == "[DONE]"
    chunks = got[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert "usage" not in chunks[-1]  # not asked for
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert content == engine.history.served[0].answer
    assert len(chunks) > 5  # a few words per event

    resp = await client.post(
        "/v1/chat/completions",
        json=chat(prompt("acme", 60), stream=True, stream_options={"include_usage": True}),
        headers=ACME,
    )
    usage_chunk = events(resp.text)[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["prompt_tokens"] == 60
    reader = StreamReader()
    for line in resp.text.split("\n"):
        reader.feed(line)
    assert (reader.done, reader.content, reader.usage) == (True, engine.history.served[1].answer, usage_chunk["usage"])


async def test_content_parts_and_max_tokens(front: tuple[Engine, httpx.AsyncClient]) -> None:
    _, client = front
    parts = [{"type": "text", "text": prompt("acme", 50)}, {"type": "image_url", "image_url": {"url": "x"}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": parts}], "max_tokens": 7, "temperature": 0}
    resp = await client.post("/v1/chat/completions", json=body, headers=ACME)
    assert resp.status_code == 200
    assert len(resp.json()["choices"][0]["message"]["content"].split()) == 7
    assert resp.json()["choices"][0]["finish_reason"] == "length"
    assert resp.json()["usage"]["prompt_tokens"] == 50


async def test_errors_are_openai_shaped(front: tuple[Engine, httpx.AsyncClient]) -> None:
    _, client = front
    cases = [
        ({}, chat("hello"), 401, "invalid_api_key"),
        ({"Authorization": "Bearer sk-nobody"}, chat("hello"), 401, "invalid_api_key"),
        (ACME, chat("hello") | {"model": "gpt-x"}, 404, "model_not_found"),
        (ACME, {"model": MODEL, "messages": []}, 400, "invalid_request"),
        (ACME, chat(prompt("acme", 401)), 400, "context_length_exceeded"),
    ]
    for headers, body, status, code in cases:
        resp = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert resp.status_code == status, (body, resp.text)
        error = resp.json()["error"]
        assert error["code"] == code
        assert set(error) == {"message", "type", "param", "code"}
    assert (await client.get("/v1/models")).json()["data"][0]["id"] == MODEL


@pytest.mark.parametrize(("mode", "status"), [(Mode.BUGGY, 200), (Mode.FIXED, 400)])
async def test_an_over_pool_prompt_buggy_200_streamed_fixed_400(mode: Mode, status: int) -> None:
    engine = Engine(replace(SMALL, mode=mode))
    app = create_front(engine, sim_keys(["acme", "globex"]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine.test") as client:
        assert (
            await client.post("/v1/chat/completions", json=chat(prompt("acme", 190)), headers=ACME)
        ).status_code == 200
        body = chat(prompt("globex", 300), stream=True)
        resp = await client.post("/v1/chat/completions", json=body, headers=GLOBEX)
    assert resp.status_code == status
    if mode is Mode.BUGGY:
        content = "".join(c["choices"][0]["delta"].get("content", "") for c in events(resp.text)[:-1])
        assert prompt("acme", 40, 1) in content  # acme's words, streamed to globex
    else:
        assert resp.json()["error"]["code"] == "context_length_exceeded"


def down(_: httpx.Request) -> httpx.Response:
    return httpx.Response(503, json={"error": "unavailable", "detail": "down"})


async def test_the_gateway_passes_answers_through_and_refuses_unknown_keys() -> None:
    engine = Engine(SMALL)
    keys = sim_keys(["acme"])
    front_app = create_front(engine, keys)
    gateway_app = create_gateway(
        upstream_url="http://engine.test",
        tenants=keys,
        bleedwatch_url="http://bleedwatch.test",
        bleedwatch_api_key="bw_x_y",
        fingerprint_key=KEY,
        flush_seconds=3600,
        fingerprint_workers=0,
        max_attempts=1,
        upstream_transport=httpx.ASGITransport(app=front_app),
        bleedwatch_transport=httpx.MockTransport(down),  # bleedwatch being down never reaches tenants
    )
    async with gateway_app.running():
        transport = httpx.ASGITransport(app=gateway_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
            plain = await client.post("/v1/chat/completions", json=chat(prompt("acme", 80)), headers=ACME)
            streamed = await client.post(
                "/v1/chat/completions", json=chat(prompt("acme", 80), stream=True), headers=ACME
            )
            refused = await client.post("/v1/chat/completions", json=chat(prompt("acme", 401)), headers=ACME)
            unknown = await client.post("/v1/chat/completions", json=chat("x"), headers=GLOBEX)
            bad = await client.post("/v1/chat/completions", content=b"{", headers=ACME)
            await gateway_app.tap.settle()
        assert gateway_app.stats.submitted == 2  # queued; delivery fails at shutdown, logged
    assert plain.status_code == 200
    assert plain.json()["choices"][0]["message"]["content"] == engine.history.served[0].answer
    assert plain.headers["x-sim-node"] == "decode-0"
    got = events(streamed.text)
    assert got[-1] == "[DONE]"
    assert "usage" not in got[-2]  # relayed as the engine wrote it: no usage unless the client asked
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "context_length_exceeded")
    assert (unknown.status_code, bad.status_code) == (401, 400)


def test_the_canary_prober_talks_to_the_engine_and_its_canary_is_caught(tmp_path: Any) -> None:
    """A canary sent to the leaky engine sits in its pages; an over-pool prompt reads it back."""
    import asyncio

    settings = Settings(redis_url=None, database_url=None, data_dir=tmp_path / "data")
    upgrade(settings)
    tokens = asyncio.run(_create_keys(settings))
    keys = sim_keys(["acme", "canary"])
    engine = Engine(SMALL)
    with local_server(create_app(settings)) as bw, local_server(create_front(engine, keys)) as engine_url:
        gateway_app = create_gateway(
            upstream_url=engine_url,
            tenants=keys,
            bleedwatch_url=bw,
            bleedwatch_api_key=tokens[Role.INGEST],
            fingerprint_key=KEY,
            flush_seconds=0.05,
        )
        with local_server(gateway_app) as gateway_url:
            probe = canary_probe(
                url=bw,
                api_key=tokens[Role.ADMIN],
                key=KEY,
                tenant="canary",
                endpoint=gateway_url,
                endpoint_key="sk-sim-canary",
                model=MODEL,
                tokens=190,
            )
            assert probe.status == 200
            leak = httpx.post(
                f"{gateway_url}/v1/chat/completions", json=chat(prompt("acme", 300)), headers=ACME, timeout=30
            )
            assert leak.status_code == 200
        # Leaving the gateway's server shut it down, and its shutdown flushed to bleedwatch.
        read = {"Authorization": f"Bearer {tokens[Role.READ]}"}
        items = httpx.get(f"{bw}/v1/findings", headers=read).json()["items"]
    (finding,) = items
    assert (finding["recipient_tenant"], finding["source_tenant"], finding["severity"]) == (
        "acme",
        "canary",
        "critical",
    )
    assert finding["source_request_ids"] == [f"canary:{probe.label}"]
