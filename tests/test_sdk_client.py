"""The gateway client against a real HTTP server on loopback that misbehaves on purpose."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service.local_server import free_port, local_server
from service.sdk.client import BleedwatchClient, Rejected, Undelivered, retry_after
from tests.traffic import exchange, words

pytestmark = pytest.mark.anyio


@dataclass
class Script:
    """Answers to give, in order; the last one repeats. Records what arrived and when."""

    answers: list[tuple[int, dict[str, str]]]
    seen: list[tuple[float, int]] = field(default_factory=list)
    prefer: list[str | None] = field(default_factory=list)

    def app(self) -> Starlette:
        async def ingest(request: Request) -> Response:
            body = orjson.loads(await request.body())
            self.seen.append((time.monotonic(), len(body["exchanges"])))
            self.prefer.append(request.headers.get("prefer"))
            status, headers = self.answers[min(len(self.seen), len(self.answers)) - 1]
            if status == 202:
                return JSONResponse({"accepted": len(body["exchanges"]), "duplicates": 0, "findings": 0}, 202)
            return JSONResponse({"error": "x", "detail": f"scripted {status}"}, status, headers=headers)

        return Starlette(routes=[Route("/v1/exchanges", ingest, methods=["POST"])])


@pytest.fixture
def scripted(request: pytest.FixtureRequest) -> Iterator[tuple[str, Script]]:
    script = Script(request.param)
    with local_server(script.app()) as url:
        yield url, script


async def wait_for(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def batch(n: int) -> list[dict[str, Any]]:
    return [exchange("acme", f"r-{i}", words("json", 0, 40), words("csv", 0, 40), time.time()) for i in range(n)]


@pytest.mark.parametrize("scripted", [[(503, {"Retry-After": "1"}), (202, {})]], indirect=True)
async def test_503_is_retried_after_retry_after(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    async with BleedwatchClient(url, "bw_k_s") as client:
        assert (await client.send(batch(2)))["accepted"] == 2
    (first, _), (second, _) = script.seen
    assert second - first >= 0.9  # a lower bound: the client waited as told


@pytest.mark.parametrize("scripted", [[(202, {})]], indirect=True)
async def test_batches_are_answered_once_queued_unless_the_caller_waits_for_processing(
    scripted: tuple[str, Script],
) -> None:
    url, script = scripted
    async with BleedwatchClient(url, "bw_k_s") as client:
        await client.send(batch(1))
    async with BleedwatchClient(url, "bw_k_s", wait_for_processing=True) as client:
        await client.send(batch(1))
    assert script.prefer == ["respond-async", None]


@pytest.mark.parametrize("scripted", [[(429, {"Retry-After": "0"}), (429, {}), (202, {})]], indirect=True)
async def test_429_is_retried_until_accepted(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    async with BleedwatchClient(url, "bw_k_s") as client:
        assert (await client.send(batch(1)))["accepted"] == 1
    assert len(script.seen) == 3


@pytest.mark.parametrize("scripted", [[(422, {})]], indirect=True)
async def test_4xx_is_rejected_at_once_with_the_servers_message(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    client = BleedwatchClient(url, "bw_k_s")
    for ex in batch(3):
        await client.submit(ex)
    with pytest.raises(Rejected, match="scripted 422") as info:
        await client.flush()
    assert info.value.status == 422
    assert len(script.seen) == 1
    assert client.rejected == 3
    await client.aclose()


@pytest.mark.parametrize("scripted", [[(202, {})]], indirect=True)
async def test_exchanges_are_batched_and_flushed_on_close(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    async with BleedwatchClient(url, "bw_k_s", batch_size=2, flush_seconds=60) as client:
        for ex in batch(5):
            await client.submit(ex)  # returns at once: the background sender posts full batches
        await wait_for(lambda: len(script.seen) == 2)
        assert [n for _, n in script.seen] == [2, 2]
    assert [n for _, n in script.seen] == [2, 2, 1]
    assert client.accepted == 5


async def test_unreachable_service_keeps_the_batch() -> None:
    client = BleedwatchClient(f"http://127.0.0.1:{free_port()}", "bw_k_s", max_attempts=3, max_backoff_seconds=0.05)
    for ex in batch(2):
        await client.submit(ex)
    with pytest.raises(Undelivered, match="2 exchanges not delivered: network error"):
        await client.flush()
    assert client.rejected == 0
    with pytest.raises(Undelivered):
        await client.aclose()  # still pending: close tries once more, and says so


def test_retry_after_forms() -> None:
    now = time.time()
    assert retry_after("7", now) == 7.0
    assert retry_after(None, now) is None
    assert retry_after("soon", now) is None
    later = retry_after(email.utils.formatdate(now + 30, usegmt=True), now)
    assert later is not None
    assert 28 <= later <= 31
