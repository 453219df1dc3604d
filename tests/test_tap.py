"""``bleedwatch tap``: bytes through unchanged, a leak through it a finding, requests it must refuse refused.

The engine is ``tests/fake_engine.py`` (the four APIs' wire formats, answers the test
chooses); bleedwatch is the real app on the test's backend (``tests/sim_stack.bleedwatch``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from bleedwatch.exchange import fingerprint_exchange
from service.auth.keys import Role
from service.cli import main
from service.config import Settings
from service.local_server import free_port, local_server
from service.tap import Tap, TapSettings
from service.tap import metrics as tap_metrics
from service.tap.apis import PATHS, Api, read_exchange, sse_data
from service.tools.sim.corpus import prompt
from tests.fake_engine import FakeEngine, request
from tests.observability import documented_metrics
from tests.sim_stack import BLEEDWATCH, bleedwatch
from tests.traffic import KEY

pytestmark = pytest.mark.anyio

APIS = list(PATHS)
NEVER = 3600.0


def tap_settings(**extra: Any) -> TapSettings:
    given: dict[str, Any] = {
        "upstream_url": "http://engine.test",
        "bleedwatch_url": BLEEDWATCH,
        "bleedwatch_api_key": SecretStr("bw_unused_key"),
        "fingerprint_key": SecretStr(KEY.hex()),
        "flush_seconds": NEVER,
        "fingerprint_workers": 0,  # in the test's process; the byte-identity test runs the worker process
        "metrics_port": "off",  # tests that scrape pick a free port
    }
    return TapSettings(**(given | extra))


@asynccontextmanager
async def tapped(
    engine: FakeEngine, settings: TapSettings | None = None, bw: httpx.AsyncBaseTransport | None = None
) -> AsyncIterator[tuple[Tap, httpx.AsyncClient]]:
    """The tap over in-process transports: the client's side, and the tap to flush."""
    tap = Tap(
        settings or tap_settings(),
        upstream_transport=httpx.ASGITransport(app=engine),
        bleedwatch_transport=bw or _down(),  # bleedwatch away: answers must not notice
        bleedwatch_max_attempts=1,
    )
    transport = httpx.ASGITransport(app=tap)
    async with tap.running(), httpx.AsyncClient(transport=transport, base_url="http://tap.test") as client:
        yield tap, client


def tenant(name: str) -> dict[str, str]:
    return {"X-Tenant-Id": name}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("path", APIS)
async def test_a_leak_through_the_tap_is_a_finding_with_its_source(settings: Settings, path: str, stream: bool) -> None:
    """acme's prompt goes through the tap; then the engine answers globex with acme's text."""
    engine = FakeEngine()
    secret = prompt("acme", 120)
    async with bleedwatch(settings) as (api, transport):
        s = tap_settings(bleedwatch_api_key=SecretStr(api.tokens[Role.INGEST]), deployment="pd-test")
        async with tapped(engine, s, transport) as (tap, client):
            engine.answer = "Sure, here is a short answer."
            source = await client.post(path, json=request(path, secret, stream=stream), headers=tenant("acme"))
            assert source.status_code == 200
            engine.answer = f"As requested: {secret}"
            leak = await client.post(
                path, json=request(path, prompt("globex", 80), stream=stream), headers=tenant("globex")
            )
            assert leak.status_code == 200
            await tap.flush()
            assert tap.stats.submitted == 2
        await api.processed()
        resp = await api.client.get("/v1/findings", headers=api.headers(Role.READ))
    (finding,) = resp.json()["items"]
    kind = path.rsplit("/", 1)[-1]
    assert (finding["recipient_tenant"], finding["source_tenant"]) == ("globex", "acme")
    assert finding["recipient_request_id"] == f"{kind}-1"
    assert finding["source_request_ids"] == [f"{kind}-0"]
    assert (finding["deployment"], finding["model"], finding["prompt_tokens"]) == ("pd-test", "fake-model", 42)


@pytest.mark.parametrize("path", APIS)
async def test_streams_pass_through_byte_for_byte(path: str) -> None:
    """Over real sockets (uvicorn both sides): the bytes and headers a client reads are the engine's own."""
    engine = FakeEngine(answer=prompt("acme", 60))
    body = orjson.dumps(request(path, "tell me", stream=True))
    with local_server(engine) as engine_url:
        settings = tap_settings(upstream_url=engine_url, fingerprint_workers=1)
        tap = Tap(settings, bleedwatch_transport=httpx.MockTransport(_accept))
        with local_server(tap) as tap_url:
            got: dict[str, tuple[bytes, httpx.Headers]] = {}
            for name, url in (("direct", engine_url), ("tap", tap_url)):
                engine.restart_ids()
                async with (
                    httpx.AsyncClient(base_url=url) as client,
                    client.stream("POST", path, content=body, headers=tenant("acme")) as resp,
                ):
                    got[name] = (b"".join([c async for c in resp.aiter_raw()]), resp.headers)
        assert tap.stats.submitted == 1  # shutting the tap's server down waited for its reading
    (direct, direct_headers), (tapped_bytes, tap_headers) = got["direct"], got["tap"]
    assert tapped_bytes == direct
    assert direct.count(b"data:") > 10
    for header in ("content-type", "x-request-id"):
        assert tap_headers[header] == direct_headers[header]


async def test_whole_answers_pass_through_byte_for_byte() -> None:
    engine = FakeEngine(answer="a plain answer")
    direct_side = httpx.AsyncClient(transport=httpx.ASGITransport(app=engine), base_url="http://engine.test")
    async with tapped(engine) as (_, client), direct_side:
        for path in APIS:
            body = request(path, "hello", stream=False)
            engine.restart_ids()
            direct = await direct_side.post(path, json=body)
            engine.restart_ids()
            through = await client.post(path, json=body, headers=tenant("acme"))
            assert (through.status_code, through.content) == (200, direct.content)
            assert through.headers["content-length"] == direct.headers["content-length"]


def _accept(_: httpx.Request) -> httpx.Response:
    return httpx.Response(202, json={"accepted": 1, "duplicates": 0, "results": []})


def _capturing() -> tuple[list[dict[str, Any]], httpx.MockTransport]:
    """A bleedwatch that accepts everything, and the exchanges the tap shipped to it."""
    shipped: list[dict[str, Any]] = []

    def accept(req: httpx.Request) -> httpx.Response:
        shipped.extend(orjson.loads(req.content)["exchanges"])
        return _accept(req)

    return shipped, httpx.MockTransport(accept)


@pytest.mark.parametrize("path", APIS)
async def test_a_request_without_the_tenant_header_is_refused_before_the_engine(path: str) -> None:
    engine = FakeEngine()
    async with tapped(engine) as (tap, client):
        missing = await client.post(path, json=request(path, "hello", stream=False))
        empty = await client.post(path, json=request(path, "hello", stream=False), headers=tenant(""))
        invalid = await client.post(path, json=request(path, "hello", stream=False), headers=tenant("ac\tme"))
    for resp in (missing, empty):
        assert resp.status_code == 400
        error = resp.json()["error"]
        assert error["code"] == "missing_tenant"
        assert "x-tenant-id header is missing" in error["message"]
        assert resp.json()["type"] == "error"  # Anthropic's clients read this shape too
    assert (invalid.status_code, invalid.json()["error"]["code"]) == (400, "invalid_tenant")
    assert engine.calls == 0
    assert tap.stats.refused == 3


async def test_the_tenant_header_is_configurable() -> None:
    engine = FakeEngine()
    async with tapped(engine, tap_settings(tenant_header="X-Org")) as (_, client):
        body = request("/v1/chat/completions", "hello", stream=False)
        assert (await client.post("/v1/chat/completions", json=body, headers=tenant("acme"))).status_code == 400
        assert (await client.post("/v1/chat/completions", json=body, headers={"X-Org": "acme"})).status_code == 200


async def test_other_paths_are_passed_or_refused_and_bodies_are_bounded() -> None:
    engine = FakeEngine()
    settings = tap_settings(max_body_bytes=4096, pass_paths="/v1/embeddings")
    async with tapped(engine, settings) as (tap, client):
        models = await client.get("/v1/models")
        embeddings = await client.post("/v1/embeddings", json={"model": "m", "input": "x"})
        native = await client.post("/generate", json={"text": "x"})
        big = await client.post(
            "/v1/chat/completions",
            json=request("/v1/chat/completions", "x" * 5000, stream=False),
            headers=tenant("acme"),
        )
        assert tap.stats.submitted == 0
    assert (models.status_code, models.json()["data"][0]["id"]) == (200, "fake-model")
    assert embeddings.status_code == 200
    assert (native.status_code, native.json()["error"]["code"]) == (404, "not_covered")
    assert (big.status_code, big.json()["error"]["code"]) == (413, "body_too_large")
    assert "BLEEDWATCH_TAP_MAX_BODY_BYTES" in big.json()["error"]["message"]
    assert engine.calls == 2  # models and embeddings only


async def test_an_unreachable_engine_is_a_502_in_the_same_shape() -> None:
    def refuse(_: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    tap = Tap(tap_settings(), upstream_transport=httpx.MockTransport(refuse), bleedwatch_transport=_down())
    transport = httpx.ASGITransport(app=tap)
    async with tap.running(), httpx.AsyncClient(transport=transport, base_url="http://tap.test") as client:
        body = request("/v1/messages", "hello", stream=False)
        resp = await client.post("/v1/messages", json=body, headers=tenant("acme"))
    assert (resp.status_code, resp.json()["error"]["code"]) == (502, "upstream_unreachable")


def _down() -> httpx.MockTransport:
    return httpx.MockTransport(lambda _: httpx.Response(503, json={"error": "unavailable", "detail": "down"}))


def test_reading_events_follows_the_sse_rules() -> None:
    raw = b'data: {"a":\r\ndata: 1}\r\n\r\n: comment\n\nevent: x\ndata:{"b":2}\n\ndata: {"cut":'
    assert list(sse_data(raw)) == [b'{"a":\n1}', b'{"b":2}']  # the cut-off last event is not complete


def test_reading_each_api_joins_system_and_messages() -> None:
    for path in APIS:
        body = orjson.dumps(request(path, "the question", stream=False, system="be brief"))
        answer = {
            Api.CHAT: {"id": "c", "choices": [{"message": {"content": "the answer"}}]},
            Api.COMPLETIONS: {"id": "c", "choices": [{"text": "the answer"}]},
            Api.RESPONSES: {
                "id": "c",
                "output": [{"type": "message", "content": [{"type": "output_text", "text": "the answer"}]}],
            },
            Api.MESSAGES: {"id": "c", "content": [{"type": "text", "text": "the answer"}]},
        }[PATHS[path]]
        exchange = read_exchange(PATHS[path], body, orjson.dumps(answer), streamed=False)
        assert exchange is not None
        expected = "the question" if PATHS[path] is Api.COMPLETIONS else "be brief\n\nthe question"
        assert (exchange.prompt, exchange.response, exchange.request_id) == (expected, "the answer", "c")
    assert read_exchange(Api.CHAT, b"not json", b"{}", streamed=False) is None


def test_the_command_explains_what_is_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("BLEEDWATCH_URL", "BLEEDWATCH_API_KEY", "BLEEDWATCH_FINGERPRINT_KEY", "BLEEDWATCH_TAP_UPSTREAM_URL"):
        monkeypatch.delenv(var, raising=False)
    assert main(["tap"]) == 2
    err = capsys.readouterr().err
    for missing in ("upstream_url", "BLEEDWATCH_API_KEY", "BLEEDWATCH_FINGERPRINT_KEY"):
        assert f"{missing}: Field required" in err


def test_the_command_serves_the_tap(tmp_path: Path) -> None:
    """``bleedwatch tap`` as an operator starts it: flags, a key file, the environment for the rest."""
    engine = FakeEngine(answer="an answer")
    key_file = tmp_path / "key.hex"
    key_file.write_text(KEY.hex())
    port, metrics_port = free_port(), free_port()
    shipped: list[dict[str, Any]] = []

    async def accept(req: Request) -> JSONResponse:
        exchanges = orjson.loads(await req.body())["exchanges"]
        shipped.extend(exchanges)
        return JSONResponse({"accepted": len(exchanges), "duplicates": 0, "results": []}, status_code=202)

    service = Starlette(routes=[Route("/v1/exchanges", accept, methods=["POST"])])
    env = {
        **os.environ,
        "BLEEDWATCH_TAP_FINGERPRINT_WORKERS": "0",
        "BLEEDWATCH_LOG_LEVEL": "warning",
        "BLEEDWATCH_TAP_METRICS_PORT": str(metrics_port),
    }
    with local_server(engine) as engine_url, local_server(service) as service_url:
        env["BLEEDWATCH_URL"] = service_url
        args = ["--upstream", engine_url, "--port", str(port), "--api-key", "bw_x", "--key-file", str(key_file)]
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", "tap", *args], env=env)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                    break
                except httpx.TransportError:
                    assert proc.poll() is None, "the tap exited"
                    assert time.monotonic() < deadline, "the tap did not start"
                    time.sleep(0.1)
            body = request("/v1/chat/completions", "hello", stream=True)
            refused = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
            answered = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=tenant("acme"))
            scraped = scrape(metrics_port)
        finally:
            proc.terminate()
            proc.wait(30)
    assert models.status_code == 200
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "missing_tenant")
    assert answered.status_code == 200
    assert answered.text.endswith("data: [DONE]\n\n")
    relayed = ("bleedwatch_tap_requests_total", (("outcome", "relayed"), ("route", "chat.completions")))
    assert scraped[relayed] == 1
    assert scraped[("bleedwatch_tap_refused_total", (("reason", "missing_tenant"),))] == 1
    assert [x["tenant"] for x in shipped] == ["acme"]  # shipped by the last flush at SIGTERM


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The tap's /metrics: each sample by name and labels."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_the_metrics_port_counts_traffic_through_the_tap() -> None:
    engine = FakeEngine(answer=prompt("acme", 60))
    sent: list[int] = []

    def accept(req: httpx.Request) -> httpx.Response:
        sent.append(len(orjson.loads(req.content)["exchanges"]))
        return httpx.Response(202, json={"accepted": sent[-1], "duplicates": 0, "results": []})

    tap = Tap(
        tap_settings(metrics_port=0, max_body_bytes=4096),
        upstream_transport=httpx.ASGITransport(app=engine),
        bleedwatch_transport=httpx.MockTransport(accept),
    )
    async with tap.running(), httpx.AsyncClient(transport=httpx.ASGITransport(app=tap), base_url="http://t") as client:
        assert tap.metrics_port
        before = scrape(tap.metrics_port)
        for path in APIS:
            assert (await client.post(path, json=request(path, "q", stream=True), headers=tenant("a"))).is_success
        await client.post("/v1/chat/completions", json=request("/v1/chat/completions", "q", stream=False))
        await client.post("/v1/chat/completions", content=b"x" * 5000, headers=tenant("a"))
        await client.get("/v1/models")
        await tap.flush()
        after = await anyio.to_thread.run_sync(scrape, tap.metrics_port)
    assert sum(sent) == 4
    assert before[("bleedwatch_tap_refused_total", (("reason", "missing_tenant"),))] == 0  # present from the start
    assert after[("bleedwatch_tap_refused_total", (("reason", "missing_tenant"),))] == 1
    assert after[("bleedwatch_tap_refused_total", (("reason", "body_too_large"),))] == 1
    for route in ("chat.completions", "completions", "responses", "messages"):
        assert after[("bleedwatch_tap_requests_total", (("outcome", "relayed"), ("route", route)))] == 1
    assert after[("bleedwatch_tap_requests_total", (("outcome", "relayed"), ("route", "passed")))] == 1
    assert after[("bleedwatch_tap_requests_total", (("outcome", "refused"), ("route", "chat.completions")))] == 2
    assert after[("bleedwatch_tap_exchanges_fingerprinted_total", (("answer", "complete"),))] == 4
    assert after[("bleedwatch_tap_exchanges_fingerprinted_total", (("answer", "partial"),))] == 0
    assert after[("bleedwatch_tap_fingerprint_seconds_count", ())] == 4
    assert after[("bleedwatch_tap_sdk_shipped_exchanges_total", ())] == 4
    assert after[("bleedwatch_tap_sdk_unsent_exchanges", ())] == 0
    assert after[("bleedwatch_tap_backlog_exchanges", ())] == 0
    assert after[("bleedwatch_tap_sdk_dropped_exchanges_total", ())] == 0
    names = {name for name, _ in after}
    assert not any("tenant" in labels for _, sample in after for labels in sample)
    assert {"a", "q"}.isdisjoint({value for _, sample in after for _, value in sample})
    for name in tap_metrics.NAMES:
        assert name in names or f"{name}_count" in names, name


def test_the_tap_metrics_are_documented_and_nothing_else() -> None:
    """docs/metrics.md's tap table against what the tap's registry exports."""
    tap = Tap(tap_settings())
    exported = set()
    for family in tap.metrics.registry.collect():
        exported.add(f"{family.name}_total" if family.type == "counter" else family.name)
    assert exported == set(tap_metrics.NAMES)
    assert documented_metrics(tap=True) == exported


@pytest.mark.parametrize("path", APIS)
async def test_a_client_leaving_mid_stream_aborts_the_upstream_and_ships_the_partial_answer(path: str) -> None:
    """Over real sockets: the engine stalls mid-answer, the client reads what came and hangs up."""
    answer = prompt("acme", 200)
    stall = 24
    engine = FakeEngine(answer=answer, stall_after=stall)
    body = orjson.dumps(request(path, prompt("globex", 80), stream=True))
    kind = path.rsplit("/", 1)[-1]
    events = engine.events(path, f"{kind}-0")
    delivered = b"".join(events[:stall])
    shipped, to_bleedwatch = _capturing()
    with local_server(engine) as engine_url:
        tap = Tap(tap_settings(upstream_url=engine_url), bleedwatch_transport=to_bleedwatch)
        with local_server(tap) as tap_url:
            async with (
                httpx.AsyncClient(base_url=tap_url) as client,
                client.stream("POST", path, content=body, headers=tenant("acme")) as resp,
            ):
                got = b""
                async for chunk in resp.aiter_raw():
                    got += chunk
                    if len(got) >= len(delivered):
                        break  # leaving the block unread closes the connection
            assert got == delivered
            # The tap closed its connection to the engine (which runs in the server's thread).
            assert await anyio.to_thread.run_sync(engine.left.wait, 10)
        # Stopping the tap's server waited for the fingerprinting, and the last flush delivered it.
    assert tap.stats.upstream_errors == 0
    assert tap.metrics.requests.labels(PATHS[path].value, "client_gone")._value.get() == 1
    assert tap.metrics.fingerprinted.labels("partial")._value.get() == 1
    read = read_exchange(PATHS[path], body, delivered, streamed=True)
    assert read is not None
    assert 0 < len(read.response) < len(answer)
    expected = fingerprint_exchange(read.prompt, read.response, key=KEY, tenant="acme", request_id="r", model="m")
    (exchange,) = shipped
    assert exchange["tenant"] == "acme"
    assert (exchange["prompt"], exchange["response"]) == (expected["prompt"], expected["response"])
    whole = fingerprint_exchange(read.prompt, answer, key=KEY, tenant="acme", request_id="r", model="m")
    assert exchange["response"] != whole["response"]


def _env_name(name: str, info: Any) -> str:
    alias = info.validation_alias
    return alias.choices[0] if alias is not None else f"BLEEDWATCH_TAP_{name.upper()}"


@pytest.mark.parametrize("doc", ["README.md", "docs/tap.md"])
def test_every_tap_setting_is_documented_and_nothing_else(doc: str) -> None:
    """Each TapSettings field is a row of the doc's settings table; every BLEEDWATCH_TAP_* it names exists."""
    text = (Path(__file__).parent.parent / doc).read_text()
    settings = {_env_name(name, info) for name, info in TapSettings.model_fields.items()}
    rows = set(re.findall(r"^\| `(BLEEDWATCH_\w+)` \|", text, flags=re.MULTILINE))
    assert settings - rows == set(), f"settings missing from {doc}'s table"
    named = set(re.findall(r"\bBLEEDWATCH_TAP_\w+", text))
    assert named - settings == set(), f"{doc} names tap settings that do not exist"
    if doc == "docs/tap.md":  # its table is the tap's alone (the README's also lists the server's)
        assert rows == settings


async def test_an_engine_breaking_off_mid_stream_ships_what_was_relayed_as_partial() -> None:
    path = "/v1/chat/completions"
    engine = FakeEngine(answer=prompt("acme", 200), stall_after=24, break_off=True)
    body = orjson.dumps(request(path, prompt("globex", 80), stream=True))
    delivered = b"".join(engine.events(path, "completions-0")[:24])
    shipped, to_bleedwatch = _capturing()
    with local_server(engine) as engine_url:
        tap = Tap(tap_settings(upstream_url=engine_url), bleedwatch_transport=to_bleedwatch)
        with local_server(tap) as tap_url:
            async with httpx.AsyncClient(base_url=tap_url) as client:
                resp = await client.post(path, content=body, headers=tenant("acme"))
    assert (resp.status_code, resp.content) == (200, delivered)  # what came, then a clean end
    assert tap.metrics.upstream_errors.labels("stream")._value.get() == 1
    assert tap.metrics.requests.labels("chat.completions", "upstream_error")._value.get() == 1
    assert tap.metrics.fingerprinted.labels("partial")._value.get() == 1
    read = read_exchange(Api.CHAT, body, delivered, streamed=True)
    assert read is not None
    expected = fingerprint_exchange(read.prompt, read.response, key=KEY, tenant="acme", request_id="r", model="m")
    (exchange,) = shipped
    assert exchange["response"] == expected["response"]
