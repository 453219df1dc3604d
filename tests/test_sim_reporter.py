"""The simulator's reporter logs why bleedwatch refused something by its error code, never a body."""

from __future__ import annotations

import time

import httpx
import pytest

from service.tools.sim.engine import Signal
from service.tools.sim.reporter import Reporter, _error_code

pytestmark = pytest.mark.anyio


def test_a_refusal_is_logged_by_its_code_not_its_body() -> None:
    refused = httpx.Response(422, json={"error": "invalid_request", "detail": "echoes of what was sent"})
    assert _error_code(refused) == "invalid_request"
    assert _error_code(httpx.Response(502, text="<html>proxy page quoting a prompt</html>")) == "(no JSON error body)"
    assert _error_code(httpx.Response(400, json=["not", "the", "error", "shape"])) == "(no error code)"


async def test_one_signal_is_logged_in_the_singular(caplog: pytest.LogCaptureFixture) -> None:
    refuse = httpx.MockTransport(lambda _: httpx.Response(422, json={"error": "invalid", "detail": "..."}))
    reporter = Reporter("http://bleedwatch.test", admin_key=None, ingest_key="k", transport=refuse)
    reporter.signal(Signal("kv_transfer_short", "pd-1", "decode-0", "r-1", time.time()))
    await reporter.flush()
    await reporter.aclose()
    assert "bleedwatch refused 1 signal: 422 invalid" in caplog.messages
