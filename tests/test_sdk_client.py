"""The gateway client against a real HTTP server on loopback that misbehaves on purpose."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bleedwatch.client import BleedwatchClient, Rejected, Undelivered, retry_after
from bleedwatch.fingerprint.scheme import Params
from bleedwatch.limits import NAME_MAX_CHARS
from service.auth.keys import Role
from service.config import Settings
from service.local_server import free_port, local_server
from tests.conftest import failed_attempts
from tests.sim_stack import BLEEDWATCH, bleedwatch
from tests.traffic import KEY, exchange, words

pytestmark = pytest.mark.anyio


@dataclass
class Script:
    """Answers to give, in order; the last one repeats. Records what arrived and when."""

    answers: list[tuple[int, dict[str, str]]]
    results: list[list[dict[str, Any]]] = field(default_factory=list)  # per 202 answer, in order, if any
    seen: list[tuple[float, int]] = field(default_factory=list)
    prefer: list[str | None] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)

    def app(self) -> Starlette:
        async def ingest(request: Request) -> Response:
            body = orjson.loads(await request.body())
            self.seen.append((time.monotonic(), len(body["exchanges"])))
            self.prefer.append(request.headers.get("prefer"))
            self.sizes.append(len(await request.body()))
            status, headers = self.answers[min(len(self.seen), len(self.answers)) - 1]
            if status == 202:
                results = self.results.pop(0) if self.results else []
                taken = len(body["exchanges"]) - sum(r["status"] == "rejected" for r in results)
                answer = {"accepted": taken, "duplicates": 0, "findings": 0, "results": results or None}
                return JSONResponse(answer, 202)
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
    assert client.dropped_by_reason == {"rejected:x": 3}
    await client.aclose()


@pytest.mark.parametrize("scripted", [[(202, {})]], indirect=True)
async def test_exchanges_are_batched_and_flushed_on_close(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    async with BleedwatchClient(url, "bw_k_s", batch_size=2, flush_seconds=60) as client:
        for ex in batch(5):
            await client.submit(ex)  # returns at once: the background sender posts full batches
        # Until the client has the answers: closed while a request is under way, that batch goes
        # again at close (delivery is at least once; the service drops the duplicate).
        await wait_for(lambda: client.accepted == 4)
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


def test_fingerprint_parameters_are_ints_as_the_service_takes_them() -> None:
    """4.0 would name another key id and travel as 4.0, which the service refuses (no coercion)."""
    for bad in ({"n": 4.0}, {"w": "3"}, {"sample_mod": True}, {"response_w": 1.0}):
        with pytest.raises(TypeError, match="must be ints"):
            Params(**bad)


async def test_a_dead_service_costs_one_round_not_one_per_flush(caplog: pytest.LogCaptureFixture) -> None:
    """A port nobody listens on: the first flush tries a round of ``max_attempts``; close, after it,
    tries what it holds once, not a round of its own, and still reports it undelivered."""
    client = BleedwatchClient(f"http://127.0.0.1:{free_port()}", "bw_k_s", max_attempts=4, max_backoff_seconds=0.01)
    for ex in batch(2):
        await client.submit(ex)
    with pytest.raises(Undelivered, match="2 exchanges not delivered: network error"):
        await client.flush()
    assert failed_attempts(caplog) == 4
    with pytest.raises(Undelivered, match="2 exchanges not delivered: network error"):
        await client.aclose()
    assert failed_attempts(caplog) == 4 + 1
    assert client.dropped_by_reason == {"closed_undelivered": 2}


@pytest.mark.parametrize("scripted", [[(502, {}), (502, {}), (502, {}), (202, {}), (502, {})]], indirect=True)
async def test_after_a_round_ran_out_a_flush_tries_once_and_an_answer_makes_rounds_whole_again(
    scripted: tuple[str, Script], caplog: pytest.LogCaptureFixture
) -> None:
    """At least once: the one attempt a flush makes after a failed round (a proxy's 502: the service
    behind it is down) is a real one, and the service, back, takes the batch. Its answer ends the
    one-attempt mode: the next failure gets a whole round again, and close after it one attempt."""
    url, script = scripted
    client = BleedwatchClient(url, "bw_k_s", max_attempts=3, max_backoff_seconds=0.01)
    for ex in batch(2):
        await client.submit(ex)
    with pytest.raises(Undelivered, match="2 exchanges not delivered: HTTP 502"):
        await client.flush()
    assert failed_attempts(caplog) == 3
    await client.flush()  # one attempt, answered
    assert (client.accepted, client.dropped) == (2, 0)
    await client.submit(batch(1)[0])
    with pytest.raises(Undelivered, match="1 exchange not delivered: HTTP 502"):
        await client.flush()
    assert failed_attempts(caplog) == 3 + 3
    with pytest.raises(Undelivered):
        await client.aclose()
    assert failed_attempts(caplog) == 3 + 3 + 1
    assert [n for _, n in script.seen] == [2, 2, 2, 2, 1, 1, 1, 1]
    assert client.dropped_by_reason == {"closed_undelivered": 1}


@pytest.mark.parametrize("scripted", [[(503, {}), (429, {}), (503, {}), (202, {})]], indirect=True)
async def test_a_service_asking_for_time_keeps_whole_rounds(
    scripted: tuple[str, Script], caplog: pytest.LogCaptureFixture
) -> None:
    """A 429 or 503 is the service, up, asking for time (a full queue): the flush after a round of
    them gets a whole round again, not the one attempt of a service found away."""
    url, script = scripted
    client = BleedwatchClient(url, "bw_k_s", max_attempts=2, max_backoff_seconds=0.01)
    await client.submit(batch(1)[0])
    with pytest.raises(Undelivered, match="1 exchange not delivered: HTTP 429"):
        await client.flush()
    await client.flush()  # 503, then taken within the same round
    assert (client.accepted, client.dropped) == (1, 0)
    assert failed_attempts(caplog) == 3
    await client.aclose()
    assert len(script.seen) == 4


def test_retry_after_forms() -> None:
    now = time.time()
    assert retry_after("7", now) == 7.0
    assert retry_after(None, now) is None
    assert retry_after("soon", now) is None
    later = retry_after(email.utils.formatdate(now + 30, usegmt=True), now)
    assert later is not None
    assert 28 <= later <= 31


async def test_the_service_rejects_one_exchange_and_the_client_keeps_the_others(settings: Settings) -> None:
    """Against the real service: an exchange only the service can judge (its clock) is rejected
    alone; the client counts it as a drop with its reason and the rest of the batch is taken."""
    future = exchange("acme", "r-late", words("json", 0, 40), words("csv", 0, 40), time.time() + 86400)
    async with bleedwatch(settings) as (api, transport):
        async with BleedwatchClient(BLEEDWATCH, api.tokens[Role.INGEST], transport=transport) as client:
            for ex in [*batch(2), future]:
                await client.submit(ex)
            await client.flush()
            assert (client.accepted, client.rejected, client.dropped) == (2, 1, 1)
            assert client.dropped_by_reason == {"rejected:invalid": 1}
            # A batch the service refuses whole (none of it could be taken) counts each exchange, by reason.
            await client.submit(exchange("acme", "r-late-2", "a b c d e", "f g h i j", time.time() + 86400))
            with pytest.raises(Rejected):
                await client.flush()
            assert client.dropped_by_reason == {"rejected:invalid": 2}
        await api.processed()


async def test_exchanges_the_service_defers_are_sent_again_once_it_takes_them() -> None:
    """A batch the service takes but for exchanges it defers (``retry_after``: too many new tenants
    this minute) is answered 202: those go again, alone, after the wait, and none is dropped."""
    deferred = {
        "status": "rejected",
        "error": "too_many_new_tenants",
        "detail": "exchanges[1].tenant: ...",
        "retry_after": 1,
    }
    refused = {"status": "rejected", "error": "invalid", "detail": "exchanges[2].ts: ..."}
    accepted = {"status": "accepted"}
    script = Script([(202, {})], results=[[accepted, deferred, refused, deferred]])
    with local_server(script.app()) as url:
        async with BleedwatchClient(url, "bw_k_s") as client:
            for ex in batch(4):
                await client.submit(ex)
            await client.flush()
    (first, sent), (again, resent) = script.seen
    assert (sent, resent) == (4, 2)
    assert again - first >= 0.9  # waited as told
    assert (client.accepted, client.rejected, client.dropped) == (3, 1, 1)
    assert client.dropped_by_reason == {"rejected:invalid": 1}


async def test_exchanges_deferred_past_the_attempts_are_kept_not_dropped() -> None:
    deferred = {"status": "rejected", "error": "too_many_new_tenants", "retry_after": 0}
    script = Script([(202, {})], results=[[deferred, deferred]] * 3)
    with local_server(script.app()) as url:
        client = BleedwatchClient(url, "bw_k_s", max_attempts=3)
        for ex in batch(2):
            await client.submit(ex)
        with pytest.raises(Undelivered, match="2 exchanges not delivered: deferred by the service 3 times"):
            await client.flush()
        assert (client.dropped, client.pending) == (0, 2)  # back in the queue for the next round
        await client.aclose()  # the service takes them now
    assert [n for _, n in script.seen] == [2, 2, 2, 2]
    assert (client.accepted, client.dropped) == (2, 0)


async def test_one_exchange_is_said_in_the_singular(caplog: pytest.LogCaptureFixture) -> None:
    deferred = {"status": "rejected", "error": "too_many_new_tenants", "retry_after": 0}
    refused = {"status": "rejected", "error": "invalid", "detail": "exchanges[1].ts: ..."}
    script = Script([(202, {})], results=[[deferred, refused]])
    with local_server(script.app()) as url:
        client = BleedwatchClient(url, "bw_k_s", max_attempts=1)
        for ex in batch(2):
            await client.submit(ex)
        with pytest.raises(Undelivered, match=r"^1 exchange not delivered: deferred by the service 1 time$"):
            await client.flush()
        await client.aclose()  # the service takes it now
    assert "bleedwatch: 1 exchange dropped (rejected:invalid: exchanges[1].ts: ...)" in caplog.messages


@pytest.mark.parametrize("scripted", [[(202, {})]], indirect=True)
async def test_names_and_sizes_the_service_would_refuse_never_travel(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    long_tenant = exchange("x" * (NAME_MAX_CHARS + 1), "r-1", "a b c d e", "f g h i j", time.time())
    newline = exchange("acme", "r-2\n", "a b c d e", "f g h i j", time.time())
    bad_meta = exchange("acme", "r-3", "a b c d e", "f g h i j", time.time(), deployment={"nested": 1})
    async with BleedwatchClient(url, "bw_k_s", max_fingerprints_per_text=20) as client:
        for ex in (long_tenant, newline, bad_meta, *batch(2)):
            await client.submit(ex)  # batch(2): a 40-word answer, more than 20 fingerprints
        await client.submit_text("p", "r", key=KEY, tenant="t" * 200, request_id="r-4", model="m")
        await client.flush()
        assert script.seen == []
        assert client.dropped_by_reason == {
            "invalid:tenant": 2,
            "invalid:request_id": 1,
            "invalid:meta": 1,
            "too_large:response": 2,
        }
        assert (client.dropped, client.rejected) == (6, 6)


@pytest.mark.parametrize("scripted", [[(202, {})]], indirect=True)
async def test_batches_are_cut_to_the_services_body_limit(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    limit = 16 * 1024
    async with BleedwatchClient(url, "bw_k_s", batch_size=100, max_body_bytes=limit) as client:
        for ex in batch(30):
            await client.submit(ex)
        await client.flush()
    assert sum(n for _, n in script.seen) == client.accepted == 30
    assert len(script.seen) > 1
    assert max(script.sizes) <= limit


async def test_a_batch_a_proxy_finds_too_large_is_cut_smaller() -> None:
    """413 from a reverse proxy whose body limit is below the service's: the client learns a smaller
    body and cuts the queue again, rather than dropping the batch whole."""
    sizes: list[int] = []

    def proxy(request: httpx.Request) -> httpx.Response:
        n = len(orjson.loads(request.content)["exchanges"])
        if n > 2:
            return httpx.Response(413, json={"error": "payload_too_large", "detail": "body over 1 MB"})
        sizes.append(n)
        return httpx.Response(202, json={"accepted": n, "duplicates": 0, "findings": 0})

    client = BleedwatchClient("http://bw", "bw_k_s", batch_size=7, transport=httpx.MockTransport(proxy))
    for ex in batch(7):
        await client.submit(ex)
    await client.aclose()
    assert (sum(sizes), client.accepted, client.dropped) == (7, 7, 0)
