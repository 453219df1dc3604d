"""SIGTERM drains: a batch in flight when ``bleedwatch serve`` is told to stop is finished and answered.

A real ``bleedwatch serve`` process on a free loopback port, on the shared Redis (a key prefix of
its own) and the session's PostgreSQL schema.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from service.auth.keys import Role
from service.config import Settings
from service.local_server import free_port
from tests.conftest import REDIS_URL, _create_keys, _drop_prefix
from tests.conftest import _truncate as truncate
from tests.traffic import TEXTS, exchange, totals, words

pytestmark = pytest.mark.anyio


def serve(env: dict[str, str], port: int, tmp_path: Path) -> subprocess.Popen[bytes]:
    with open(tmp_path / f"serve-{port}.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(port)], env=env, stdout=log, stderr=log
        )
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        assert proc.poll() is None, (tmp_path / f"serve-{port}.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "bleedwatch serve did not become ready"
        time.sleep(0.05)


def big_batch(now: float, n: int) -> list[dict[str, Any]]:
    """Enough work to take a good second: long prompts of real text, and one leak."""
    filler = " ".join(" ".join(text) for name, text in TEXTS.items() if name != "argparse")
    out = [exchange("tenant-a", "r-a", words("argparse"), words("json", 0, 30), now)]
    out += [
        exchange(f"t-{i}", f"r-{i}", f"{i} " + filler * 3, words("csv", i % 50, i % 50 + 40), now) for i in range(n)
    ]
    out.append(exchange("tenant-b", "r-b", words("heapq"), words("argparse", 60, 110), now))
    return out


async def test_sigterm_finishes_the_batch_in_flight(pg_url: str, tmp_path: Path) -> None:
    truncate(pg_url)
    prefix = f"bwshut{uuid.uuid4().hex[:8]}"
    settings = Settings(redis_url=REDIS_URL, database_url=pg_url, key_prefix=prefix, data_dir=tmp_path)
    tokens = await _create_keys(settings)
    env = os.environ | {
        "BLEEDWATCH_REDIS_URL": REDIS_URL,
        "BLEEDWATCH_DATABASE_URL": pg_url,
        "BLEEDWATCH_KEY_PREFIX": prefix,
        "BLEEDWATCH_RATE_LIMIT_PER_SECOND": "0",
        "BLEEDWATCH_LOG_LEVEL": "warning",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    body = orjson.dumps({"exchanges": big_batch(time.time(), 160)})
    headers = {"Authorization": f"Bearer {tokens[Role.INGEST]}", "Content-Type": "application/json"}
    port = free_port()
    proc = serve(env, port, tmp_path)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            posting = asyncio.create_task(client.post("/v1/exchanges", content=body, headers=headers))
            await asyncio.sleep(0.4)  # the body is on its way: the batch is being processed
            assert not posting.done(), "the batch was too quick to be caught in flight"
            proc.send_signal(signal.SIGTERM)
            answer = await posting
        assert answer.status_code == 202, answer.text
        assert totals(answer.json()) == {"accepted": 162, "duplicates": 0, "findings": 1, "processed": True}
        # After draining, uvicorn re-raises the signal it caught: the exit status says "terminated".
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    try:
        with psycopg.connect(pg_url) as conn:
            rows = conn.execute("SELECT source_tenant, recipient_request_id FROM findings").fetchall()
        assert rows == [("tenant-a", "r-b")]
        # A new process sees the batch as done: every idempotency mark was written before the exit.
        port = free_port()
        again = serve(env, port, tmp_path)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                resp = await client.post("/v1/exchanges", content=body, headers=headers)
            assert totals(resp.json()) == {"accepted": 0, "duplicates": 162, "findings": 0, "processed": True}
        finally:
            again.terminate()
            again.wait(timeout=30)
    finally:
        _drop_prefix(prefix)
