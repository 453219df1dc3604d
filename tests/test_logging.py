"""Structured logs: JSON lines, an HTTP request id per call, route templates, no tenant data."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.auth.keys import Role
from service.config import Settings
from service.local_server import free_port
from service.logging import JsonFormatter, TextFormatter, log_config
from tests.conftest import Api, running_api
from tests.traffic import BOILERPLATE, exchange, words

pytestmark = pytest.mark.anyio

SECRETS = ("tenant-a", "tenant-b", "r-a", "r-b", "acme-secret")


def _record(msg: str = "something_happened", exc: BaseException | None = None, **extra: Any) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    record = logging.LogRecord("bleedwatch.test", logging.WARNING, __file__, 1, msg, None, exc_info)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_json_formatter_writes_one_object_per_line_with_extra_fields() -> None:
    line = JsonFormatter().format(_record(finding_id=7, severity="high"))
    assert "\n" not in line
    out = json.loads(line)
    assert out["event"] == "something_happened"
    assert out["level"] == "warning"
    assert out["logger"] == "bleedwatch.test"
    assert (out["finding_id"], out["severity"]) == (7, "high")
    assert out["ts"].endswith("+00:00")


def test_uvicorns_coloured_copy_of_the_event_is_left_out() -> None:
    record = _record("Started server process [%d]", color_message="Started server process [\x1b[36m%d\x1b[0m]")
    record.args = (7,)
    for formatter in (JsonFormatter(), TextFormatter()):
        text = formatter.format(record)
        assert "Started server process [7]" in text
        assert "color_message" not in text
        assert "\x1b" not in text
        assert "\\u001b" not in text


def test_exceptions_keep_type_and_stack_but_never_the_message() -> None:
    secret = "-".join(("acme", "secret"))
    try:
        raise ValueError(f"unique violation: ('{secret}', 'r-1')")  # the frame shows this line, not the value
    except ValueError as exc:
        caught = exc
    for formatter in (JsonFormatter(), TextFormatter()):
        text = formatter.format(_record(exc=caught))
        assert "ValueError" in text
        assert "test_logging.py" in text  # the stack frames
        assert "acme-secret" not in text


def test_log_config_applies_to_a_process(tmp_path: Path) -> None:
    code = (
        "import logging, logging.config\n"
        "from service.logging import log_config\n"
        "logging.config.dictConfig(log_config('info', 'json'))\n"
        "logging.getLogger('uvicorn.error').info('Started server process')\n"
        "logging.getLogger('uvicorn.access').info('GET /v1/findings?recipient_tenant=acme-secret')\n"
        "logging.getLogger('bleedwatch.x').debug('hidden')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True, cwd=tmp_path
    )
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["event"] for line in lines] == ["Started server process"]
    assert log_config("debug", "text")["formatters"]["bleedwatch"]["()"] == "service.logging.TextFormatter"


async def test_request_id_in_and_out_and_access_lines_carry_templates_only(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bleedwatch.access")
    given = "gw-7f3a9c2e41"
    resp = await api.client.get(
        "/v1/findings", params={"recipient_tenant": "acme-secret"}, headers={"X-Request-Id": given}
    )
    assert resp.status_code == 401
    assert resp.headers["x-request-id"] == given
    fresh = await api.client.get("/v1/findings/12", headers={"X-Request-Id": "not an id!"})
    assert fresh.headers["x-request-id"] != "not an id!"
    assert len(fresh.headers["x-request-id"]) == 32
    assert (await api.client.get("/no/such/page")).status_code == 404
    access = [r for r in caplog.records if r.name == "bleedwatch.access"]
    assert [(r.__dict__["route"], r.__dict__["status"]) for r in access] == [
        ("/v1/findings", 401),
        ("/v1/findings/{finding_id}", 401),
        ("unmatched", 404),
    ]
    lines = [json.loads(JsonFormatter().format(r)) for r in access]
    assert all(line["duration_seconds"] >= 0 for line in lines)
    assert "acme-secret" not in caplog.text


async def test_answers_given_before_routing_keep_their_route(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bleedwatch.access")
    settings = Settings(redis_url=None, database_url=None, data_dir=tmp_path / "data", max_body_bytes=1024)
    async with running_api(settings) as small:
        too_large = await small.client.post("/v1/exchanges", content=b"x" * 2048, headers=small.headers(Role.INGEST))
        assert too_large.status_code == 413
        assert (await small.client.get("/v1/findings/7/x")).status_code == 404
    access = [(r.__dict__["route"], r.__dict__["status"]) for r in caplog.records if r.name == "bleedwatch.access"]
    assert access == [("/v1/exchanges", 413), ("unmatched", 404)]


async def test_ingest_with_a_leak_logs_no_tenant_data(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    # What log_config lets through: bleedwatch's own loggers and uvicorn at debug; third-party
    # loggers (aiosqlite logs SQL parameters at debug) at warning.
    config = log_config("debug")
    for name, logger in config["loggers"].items():
        caplog.set_level(logger["level"], logger=name)
    caplog.set_level(config["root"]["level"])
    caplog.handler.setLevel(logging.DEBUG)  # the loggers filter, as configured
    now = time.time()
    source = exchange("tenant-a", "r-a", BOILERPLATE + " " + words("argparse"), words("json", 0, 120), now)
    leak = exchange(
        "tenant-b",
        "r-b",
        BOILERPLATE + " " + words("sqlite3"),
        words("csv", 0, 100) + " " + words("argparse", 60, 100) + " " + words("heapq", 0, 60),
        now + 1,
    )
    resp = await api.client.post("/v1/exchanges", json={"exchanges": [source, leak]}, headers=api.headers(Role.INGEST))
    assert resp.status_code == 202
    events = [r.getMessage() for r in caplog.records]
    assert "finding_created" in events
    assert "http_request" in events
    text = "\n".join(JsonFormatter().format(r) for r in caplog.records)
    for secret in SECRETS:
        assert secret not in text
    fingerprints = source["prompt"]["fingerprints"]
    assert fingerprints[:12] not in text


def test_bleedwatch_serve_logs_json_lines_without_raw_paths(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLEEDWATCH_")}
    env |= {"BLEEDWATCH_DATA_DIR": str(tmp_path / "data"), "BLEEDWATCH_PORT": str(port)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, "bleedwatch serve exited"
            assert time.monotonic() < deadline, "bleedwatch serve did not start"
            time.sleep(0.1)
        resp = httpx.get(f"http://127.0.0.1:{port}/v1/findings?recipient_tenant=acme-secret", timeout=5)
        assert resp.status_code == 401
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert any(line["event"] == "Application startup complete." for line in lines)
    assert not [line for line in lines if "color_message" in line]
    access = [line for line in lines if line["event"] == "http_request"]
    assert [(a["method"], a["route"], a["status"]) for a in access] == [("GET", "/v1/findings", 401)]
    assert access[0]["http_request_id"] == resp.headers["x-request-id"]
    assert "acme-secret" not in out
