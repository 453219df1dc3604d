"""The ``bleedwatch`` commands, run the way an operator runs them."""

from __future__ import annotations

import functools
import re
import time
from pathlib import Path

import httpx
import orjson
import pytest
from alembic.script import ScriptDirectory
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse

from bleedwatch.client import BleedwatchClient
from service.app import create_app
from service.cli import main
from service.config import Settings
from service.local_server import free_port, local_server
from service.migrate import describe, migrations_dir
from tests.conftest import failed_attempts
from tests.traffic import KEY, words


@pytest.fixture
def embedded_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for var in ("BLEEDWATCH_REDIS_URL", "BLEEDWATCH_DATABASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("BLEEDWATCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("BLEEDWATCH_API_KEY_CACHE_SECONDS", "0")
    return Settings()


def create(capsys: pytest.CaptureFixture[str], role: str) -> tuple[str, str]:
    assert main(["keys", "create", "--name", f"cli {role}", "--role", role]) == 0
    out = capsys.readouterr().out
    match = re.search(r"created key (\w+) \((\w+)\).*\n(bw_\S+)", out)
    assert match, out
    return match.group(1), match.group(3)


def test_migrate_says_which_database_and_revision(embedded_env: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    database = (embedded_env.data_dir / "bleedwatch.db").resolve()
    head = ScriptDirectory(str(migrations_dir())).get_current_head()
    assert main(["migrate"]) == 0
    assert capsys.readouterr().out == f"sqlite:///{database}: schema migrated from revision (empty) to {head}\n"
    assert main(["migrate"]) == 0
    assert capsys.readouterr().out == f"sqlite:///{database}: schema already at revision {head}\n"
    assert describe(Settings(database_url="postgresql://bw:hunter2@db:5432/bw")) == "postgresql://bw:***@db:5432/bw"


def test_a_database_that_is_away_or_never_migrated_is_one_line_not_a_traceback(
    embedded_env: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    database = (embedded_env.data_dir / "bleedwatch.db").resolve()
    assert main(["keys", "create", "--name", "first", "--role", "admin"]) == 1
    assert capsys.readouterr().err == (
        f"bleedwatch keys: sqlite:///{database}: no such table: api_keys: run `bleedwatch migrate` first\n"
    )
    monkeypatch.setenv("BLEEDWATCH_DATABASE_URL", "postgresql://bw:hunter2@127.0.0.1:9/bw")
    assert main(["migrate"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bleedwatch migrate: postgresql://bw:***@127.0.0.1:9/bw: connection failed:")
    assert err.count("\n") == 1
    assert "hunter2" not in err


def test_keys_create_list_revoke(embedded_env: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate"]) == 0
    key_id, token = create(capsys, "read")
    assert main(["keys", "list"]) == 0
    listing = capsys.readouterr().out
    assert key_id in listing
    assert "active" in listing
    assert token.removeprefix(f"bw_{key_id}_") not in listing  # the secret is shown once only
    with local_server(create_app(embedded_env)) as url:
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{url}/v1/findings", headers=auth).status_code == 200
        assert main(["keys", "revoke", key_id]) == 0
        assert httpx.get(f"{url}/v1/findings", headers=auth).status_code == 401
    assert main(["keys", "revoke", key_id]) == 1
    assert main(["keys", "list"]) == 0
    assert "revoked" in capsys.readouterr().out
    # An admin key minted from a shell is in the audit log as one minted through the API is.
    admin_id, admin = create(capsys, "admin")
    with local_server(create_app(embedded_env)) as url:
        audit = httpx.get(f"{url}/v1/audit", params={"key_id": "cli"}, headers={"Authorization": f"Bearer {admin}"})
    rows = [(e["action"], e["target"]) for e in reversed(audit.json()["items"])]
    listed, read_key = ("keys.list", "keys"), f"key:{key_id}"
    assert rows == [
        ("keys.create", read_key),
        listed,
        ("keys.revoke", read_key),
        listed,
        ("keys.create", f"key:{admin_id}"),
    ]


def test_replay_finds_the_leak_in_a_traffic_file(
    embedded_env: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate"]) == 0
    _, ingest = create(capsys, "ingest")
    _, read = create(capsys, "read")
    now = time.time()
    lines = [
        {
            "ts": now,
            "tenant": "b",
            "request_id": "rb",
            "model": "m",
            "prompt": words("csv"),
            "response": words("json", 0, 50) + " " + words("argparse", 100, 150),
            "meta": {"node": "n7"},
        },
        {
            "ts": "2026-12-02T10:00:00+00:00",
            "tenant": "a",
            "request_id": "ra",
            "model": "m",
            "prompt": words("argparse"),
            "response": words("heapq", 0, 60),
        },
    ]
    traffic = tmp_path / "traffic.jsonl"
    traffic.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    key_file = tmp_path / "key.hex"
    key_file.write_text(KEY.hex())
    with local_server(create_app(embedded_env)) as url:
        args = ["replay", str(traffic), "--url", url, "--api-key", ingest, "--key-file", str(key_file)]
        assert main([*args, "--batch-size", "1"]) == 0
        out = capsys.readouterr().out
        assert "sent 2 exchanges: 2 accepted, 0 duplicates, findings created or extended 1 time," in out
        assert main(args) == 0
        assert "0 accepted, 2 duplicates" in capsys.readouterr().out
        items = httpx.get(f"{url}/v1/findings", headers={"Authorization": f"Bearer {read}"}).json()["items"]
    assert [(f["source_tenant"], f["recipient_tenant"], f["node"]) for f in items] == [("a", "b", "n7")]


@pytest.mark.parametrize("command", [["keys", "create", "--name", "x", "--role", "read"], ["migrate"], ["serve"]])
def test_a_data_directory_that_cannot_be_created_is_one_line(
    embedded_env: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    (tmp_path / "file").write_text("")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BLEEDWATCH_DATA_DIR", str(tmp_path / "file" / "data"))
        env.setenv("BLEEDWATCH_PORT", str(free_port()))
        assert main(command) == 2
    err = capsys.readouterr().err
    assert (
        err == f"bleedwatch {command[0]}: BLEEDWATCH_DATA_DIR {tmp_path}/file/data: cannot create it: Not a directory\n"
    )


def test_replay_to_a_server_that_is_down_names_it(
    embedded_env: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing listens on port 9: one round of the client's 8 attempts (its retries made quick here),
    then one attempt at close, not a second round (the replay's flush, then close, each took 8)."""
    quick = functools.partial(BleedwatchClient, max_backoff_seconds=0.01)
    monkeypatch.setattr("service.tools.replay.BleedwatchClient", quick)
    traffic = tmp_path / "traffic.jsonl"
    line = {"ts": 1, "tenant": "a", "request_id": "r", "model": "m", "prompt": words("csv"), "response": "r"}
    traffic.write_bytes(orjson.dumps(line) + b"\n")
    key_file = tmp_path / "key.hex"
    key_file.write_text(KEY.hex())
    url = "http://user:secret@127.0.0.1:9/"
    assert main(["replay", str(traffic), "--url", url, "--api-key", "bw_a_b", "--key-file", str(key_file)]) == 1
    err = capsys.readouterr().err
    assert "bleedwatch replay: sending to bleedwatch at http://127.0.0.1:9: 1 exchange not delivered: network" in err
    assert "secret" not in err
    assert failed_attempts(caplog) == 8 + 1


def test_replay_without_keys_explains(embedded_env: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "x.jsonl", "--api-key", "bw_a_b"]) == 2
    assert "fingerprint key" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b"[1, 2]", "traffic.jsonl:2: not a JSON object"),
        (b'{"ts": 1, "tenant": "a"}', "traffic.jsonl:2: missing model, prompt, request_id, response"),
        (b'{"ts": 1, "tenant": 7, "request_id": "r", "model": "m", "prompt": "p", "response": "r"}', "tenant is not"),
        (b'{"ts": "friday", "tenant": "a", "request_id": "r", "model": "m", "prompt": "p", "response": "r"}', "ts is"),
        (b'{"ts": true, "tenant": "a", "request_id": "r", "model": "m", "prompt": "p", "response": "r"}', "ts is"),
        (
            b'{"ts": 1, "tenant": "a", "request_id": "r", "model": "m", "prompt": "p", "response": "r", "meta": 3}',
            "meta",
        ),
        (b"{", "traffic.jsonl:2: not JSON"),
    ],
)
def test_replay_names_the_line_that_is_no_exchange_and_sends_nothing(
    embedded_env: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str], line: bytes, error: str
) -> None:
    good = b'{"ts": 1, "tenant": "a", "request_id": "r0", "model": "m", "prompt": "p", "response": "r"}'
    traffic = tmp_path / "traffic.jsonl"
    traffic.write_bytes(good + b"\n" + line + b"\n")
    # Nothing listens on this port: the file is read whole before anything is sent.
    args = ["replay", str(traffic), "--url", "http://127.0.0.1:9", "--api-key", "bw_a_b", "--key-file"]
    key_file = tmp_path / "key.hex"
    key_file.write_text(KEY.hex())
    assert main([*args, str(key_file)]) == 2
    err = capsys.readouterr().err
    assert error in err
    assert "Traceback" not in err


def test_replay_explains_a_missing_file_and_a_key_that_is_no_key(
    embedded_env: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "key.hex"
    key_file.write_text(KEY.hex())
    assert main(["replay", str(tmp_path / "none.jsonl"), "--api-key", "bw_a_b", "--key-file", str(key_file)]) == 2
    assert "No such file" in capsys.readouterr().err
    for bad, reason in (("zz", "must be hex"), ("abcd", "must be 16 to")):
        key_file.write_text(bad)
        assert main(["replay", "x.jsonl", "--api-key", "bw_a_b", "--key-file", str(key_file)]) == 2
        assert reason in capsys.readouterr().err
    # A key file that cannot be read is a usage error of the flag, for every command that takes one.
    key_file.write_bytes(b"\xff\xfe")
    for command in (["replay", "x.jsonl"], ["tap"], ["sim", "gateway"]):
        for path, reason in (
            (tmp_path / "none.hex", "No such file"),
            (tmp_path, "Is a directory"),
            (key_file, "not text"),
        ):
            with pytest.raises(SystemExit) as exit_:
                main([*command, "--key-file", str(path)])
            assert exit_.value.code == 2
            err = capsys.readouterr().err
            assert "--key-file: " in err
            assert reason in err


def test_demo_catches_its_leak(capsys: pytest.CaptureFixture[str]) -> None:
    """The incident end to end: the buggy engine's leaks are findings, the fixed engine's traffic none."""
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    buggy, _, fixed = out.partition("3. The fixed engine")
    assert "681,280 tokens for a 1,048,576-token context" in buggy
    assert "critical kv_pool_below_context_length: the prefill KV pool holds 681,280 tokens" in buggy
    assert "HTTP answers: 24 x 200" in buggy
    assert re.search(r"bleedwatch: (1 finding|[2-9] findings|[1-9]\d+ findings)\n", buggy)
    assert re.search(r"\w+'s prompt text reached \w+ in chatcmpl-\w+", buggy)
    assert "deployment sim-pd-1, node decode-" in buggy
    assert re.search(r"every leak the engine knows of: (\d+)/\1 found, \1 with the right source", buggy)
    assert 'bleedwatch_deployment_risk_violations{rule="kv_pool_below_context_length"} 2.0' in buggy
    assert "HTTP answers: 20 x 200, 4 x 400" in fixed
    assert "bleedwatch: 0 findings\n" in fixed
    assert re.search(
        r"result: buggy engine (1 finding|[2-9] findings|[1-9]\d+ findings), fixed engine 0: as expected", fixed
    )


def test_a_service_that_refuses_or_is_gone_is_one_line_not_a_traceback(
    embedded_env: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each ends in the call that failed and why, exit 1: a cron job sees it, an operator reads it."""
    assert main(["migrate"]) == 0
    _, ingest = create(capsys, "ingest")
    _, admin = create(capsys, "admin")
    key_file = tmp_path / "key.hex"
    key_file.write_text(KEY.hex())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text(words("argparse"))
    unanswered = FastAPI()

    @unanswered.post("/v1/chat/completions")
    def refuse() -> JSONResponse:
        return JSONResponse({"error": {"message": "bad key"}}, status_code=401)

    @unanswered.post("/v1/allowlist")
    def not_bleedwatch() -> PlainTextResponse:
        return PlainTextResponse("ok")

    with local_server(create_app(embedded_env)) as url, local_server(unanswered) as engine:
        add = ["allowlist", "add", str(docs), "--url", url, "--key-file", str(key_file)]
        assert main([*add, "--api-key", ingest]) == 1  # an admin's route
        assert capsys.readouterr().err.startswith("bleedwatch allowlist: POST /v1/allowlist -> 403 forbidden: ")
        probe = ["canary", "probe", "--url", url, "--api-key", admin, "--key-file", str(key_file), "--model", "m"]
        assert main([*probe, "--endpoint", engine, "--endpoint-key", "k", "--tokens", "50"]) == 1
        out = capsys.readouterr()
        assert "engine answered 401" in out.out
        assert "was not answered (HTTP 401)" in out.err
        assert main([*add, "--api-key", admin, "--url", engine]) == 1
        assert capsys.readouterr().err.endswith("POST /v1/allowlist -> 200 but not JSON: is this bleedwatch?\n")
    assert main([*add, "--api-key", admin]) == 1  # the service is gone
    assert capsys.readouterr().err.startswith(f"bleedwatch allowlist: cannot reach {url}: ")
    assert main([*add, "--api-key", admin, "--url", "http://[::1"]) == 2
    assert capsys.readouterr().err.startswith("bleedwatch allowlist: ")


def test_serve_trusts_the_forwarded_header_of_the_proxies_named(
    embedded_env: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Behind a load balancer every client has its address: the auth-failure buckets are per client only
    when uvicorn trusts the balancer's X-Forwarded-For."""
    import uvicorn

    ran: dict[str, object] = {}
    monkeypatch.setattr(uvicorn, "run", lambda *_, **kwargs: ran.update(kwargs))
    monkeypatch.setenv("BLEEDWATCH_FORWARDED_ALLOW_IPS", "10.0.0.0/8, 192.168.1.7")
    assert main(["serve"]) == 0
    assert ran["forwarded_allow_ips"] == "10.0.0.0/8, 192.168.1.7"
    monkeypatch.setenv("BLEEDWATCH_FORWARDED_ALLOW_IPS", "10.0.0.0/8,lb.internal")
    assert main(["serve"]) == 2
    assert "'lb.internal' is no IP address or network" in capsys.readouterr().err
