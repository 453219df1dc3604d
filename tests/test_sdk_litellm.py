"""The LiteLLM callback, called the way LiteLLM calls a CustomLogger, in the suite's own venv.

LiteLLM is not a dependency (about 450 MB installed), so these tests drive the callback through
LiteLLM's interface: ``async_log_success_event``/``log_success_event(kwargs, response_obj,
start_time, end_time)`` with ``kwargs`` carrying ``standard_logging_object``, shaped as litellm
1.110.2 hands them. tests/test_sdk_litellm_real.py runs the real package, in a venv of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest

from bleedwatch.client import BleedwatchClient, Undelivered
from bleedwatch.litellm import BleedwatchLogger, bleedwatch_callback, claim_spool, exchange_from_callback
from service.auth.keys import Role
from service.config import Settings
from tests.sim_stack import BLEEDWATCH, bleedwatch
from tests.traffic import KEY, words

pytestmark = pytest.mark.anyio

START = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def response_obj(request_id: str, content: str, prompt_tokens: int) -> Any:
    """Shaped like litellm.ModelResponse: attributes all the way down."""
    message = SimpleNamespace(role="assistant", content=content)
    return SimpleNamespace(
        id=request_id,
        model="open-weights-1m",
        choices=[SimpleNamespace(index=0, message=message, finish_reason="stop")],
        usage=SimpleNamespace(prompt_tokens=prompt_tokens, completion_tokens=50, total_tokens=prompt_tokens + 50),
    )


def call_id(team: str | None, prompt: str) -> str:
    """LiteLLM's id of one call (``standard_logging_object["id"]``), here one per team and prompt."""
    return f"call-{team}-{hashlib.sha256(prompt.encode()).hexdigest()[:8]}"


def callback_kwargs(team: str | None, prompt: str, **slo: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": "x"}, {"role": "user", "content": prompt}]
    standard = {
        "id": call_id(team, prompt),
        "call_type": "acompletion",
        "model": "open-weights-1m",
        "model_group": "open-weights-1m",
        "model_id": "pd-eu-1",
        "api_base": "http://decode-7.internal:30000/v1",
        "startTime": START.timestamp(),
        "prompt_tokens": 0,
        "metadata": {"user_api_key_team_id": team, "user_api_key_user_id": "user-1", "user_api_key_hash": "h"},
        "messages": messages,
        "hidden_params": {"model_id": "pd-eu-1", "api_base": "http://decode-7.internal:30000/v1"},
    } | slo
    return {
        "model": "open-weights-1m",
        "messages": messages,
        "call_type": "acompletion",
        "standard_logging_object": standard,
    }


def test_the_hooks_have_litellms_signature() -> None:
    for hook in ("async_log_success_event", "async_log_failure_event", "log_success_event", "log_failure_event"):
        params = list(inspect.signature(getattr(BleedwatchLogger, hook)).parameters)
        assert params == ["self", "kwargs", "response_obj", "start_time", "end_time"]
        assert inspect.iscoroutinefunction(getattr(BleedwatchLogger, hook)) == hook.startswith("async_")
    if importlib.util.find_spec("litellm") is None:
        assert BleedwatchLogger.__mro__[1] is object
    else:  # pragma: no cover - where LiteLLM is installed, LiteLLM must recognise it
        from litellm.integrations.custom_logger import CustomLogger

        assert isinstance(bleedwatch_callback, CustomLogger)


async def test_a_leak_between_two_litellm_teams_is_found(settings: Settings) -> None:
    source = words("argparse")
    leaked = words("csv", 0, 60) + " " + words("argparse", 100, 160) + " " + words("heapq", 0, 40)
    async with bleedwatch(settings) as (api, transport):
        client = BleedwatchClient(BLEEDWATCH, api.tokens[Role.INGEST], flush_seconds=3600, transport=transport)
        logger = BleedwatchLogger(client=client, fingerprint_key=KEY)
        await logger.async_log_success_event(
            callback_kwargs("team-a", source), response_obj("chatcmpl-a", words("json", 0, 80), 900), START, START
        )
        # Streamed: LiteLLM hands the assembled answer in kwargs["complete_streaming_response"].
        kwargs = callback_kwargs("team-b", words("sqlite3")) | {
            "complete_streaming_response": {
                "id": "chatcmpl-b",
                "choices": [{"message": {"role": "assistant", "content": leaked}}],
                "usage": {"prompt_tokens": 700_001},
            }
        }
        await logger.async_log_success_event(kwargs, None, START, START)
        assert (logger.submitted, logger.skipped, logger.errors) == (2, 0, 0)
        await logger.flush()
        await api.processed()
        items = (await api.client.get("/v1/findings", headers=api.headers(Role.READ))).json()["items"]
        await logger.aclose()
    (f,) = items
    assert (f["recipient_tenant"], f["recipient_request_id"]) == ("team-b", call_id("team-b", words("sqlite3")))
    assert (f["source_tenant"], f["source_request_ids"]) == ("team-a", [call_id("team-a", source)])
    assert (f["model"], f["deployment"], f["node"]) == (
        "open-weights-1m",
        "pd-eu-1",
        "http://decode-7.internal:30000/v1",
    )
    assert f["prompt_tokens"] == 700_001
    assert datetime.fromisoformat(f["response_at"]) == START


async def test_a_spoofed_end_user_naming_the_victim_cannot_hide_a_leak(settings: Settings) -> None:
    """The attacker's key has no team; it sets OpenAI's ``user`` to the victim's tenant. Taken as
    the tenant, the leaked answer would be the victim's own text (self-echo) and nothing found;
    taken from the key, the matcher sees the victim's prompt in another tenant's answer."""
    source = words("argparse")
    leaked = words("csv", 0, 60) + " " + words("argparse", 100, 160) + " " + words("heapq", 0, 40)
    async with bleedwatch(settings) as (api, transport):
        client = BleedwatchClient(BLEEDWATCH, api.tokens[Role.INGEST], flush_seconds=3600, transport=transport)
        logger = BleedwatchLogger(client=client, fingerprint_key=KEY)
        await logger.async_log_success_event(
            callback_kwargs("team-a", source), response_obj("chatcmpl-a", words("json", 0, 80), 900), START, START
        )
        spoof = {"user_api_key_hash": "key-b", "user_api_key_end_user_id": "team-a"}
        kwargs = callback_kwargs(None, words("sqlite3"), metadata=spoof, end_user="team-a")
        kwargs["optional_params"] = {"user": "team-a"}
        await logger.async_log_success_event(kwargs, response_obj("chatcmpl-b", leaked, 700), START, START)
        assert (logger.submitted, logger.skipped, logger.errors) == (2, 0, 0)
        await logger.flush()
        await api.processed()
        items = (await api.client.get("/v1/findings", headers=api.headers(Role.READ))).json()["items"]
        await logger.aclose()
    (f,) = items
    assert (f["recipient_tenant"], f["recipient_request_id"]) == ("key-b", call_id(None, words("sqlite3")))
    assert (f["source_tenant"], f["source_request_ids"]) == ("team-a", [call_id("team-a", source)])


def test_what_the_callback_takes_from_litellms_arguments() -> None:
    kwargs = callback_kwargs(None, "a prompt")
    got = exchange_from_callback(kwargs, response_obj("r-1", "an answer", 12), START)
    assert got is not None
    assert (got.tenant, got.model, got.ts) == ("user-1", "open-weights-1m", START.timestamp())
    assert got.request_id == call_id(None, "a prompt")  # LiteLLM's, not the provider's "r-1"
    assert got.prompt == "x\n\na prompt"
    assert got.meta == {"deployment": "pd-eu-1", "node": "http://decode-7.internal:30000/v1", "prompt_tokens": 12}
    team = exchange_from_callback(callback_kwargs("team-a", "p"), response_obj("r", "a", 1), START)
    assert team is not None
    assert team.tenant == "team-a"
    org = exchange_from_callback(
        callback_kwargs(None, "p", metadata={"user_api_key_org_id": "org-7", "user_api_key_hash": "h"}),
        response_obj("r", "a", 1),
        START,
    )
    assert org is not None
    assert org.tenant == "org-7"
    # The end user (OpenAI's `user`, written by the caller) is kept under the tenant, never made the tenant.
    spoofed = callback_kwargs(
        "team-a", "p", end_user="team-b", metadata={"user_api_key_team_id": "team-a", "user_api_key_end_user_id": "u9"}
    )
    got_spoofed = exchange_from_callback(spoofed, response_obj("r", "a", 1), START)
    assert got_spoofed is not None
    assert (got_spoofed.tenant, got_spoofed.meta["end_user"]) == ("team-a", "u9")
    only_end_user = callback_kwargs(None, "p", metadata={"user_api_key_end_user_id": "c-9"}, end_user="customer-9")
    assert exchange_from_callback(only_end_user, response_obj("r", "a", 1), START) is None
    with pytest.raises(ValueError, match="end-user id"):
        BleedwatchLogger(tenant_fields=("user_api_key_team_id", "end_user"))
    parts = callback_kwargs("t", "unused")
    parts["messages"] = [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image_url"}]}]
    assert exchange_from_callback(parts, response_obj("r", "a", 1), START).prompt == "hello"  # type: ignore[union-attr]

    nothing = [
        callback_kwargs("t", "p") | {"call_type": "aembedding"},  # not a chat call
        callback_kwargs(None, "p", metadata={}),  # no tenant anywhere
        callback_kwargs("t", "redacted-by-litellm"),  # message logging turned off
        callback_kwargs("t", "p", messages=[]) | {"messages": []},
    ]
    for case in nothing:
        assert exchange_from_callback(case, response_obj("r", "a", 1), START) is None
    assert exchange_from_callback(callback_kwargs("t", "p"), SimpleNamespace(id="r", choices=[]), START) is None
    assert exchange_from_callback(callback_kwargs("t", "p"), response_obj("r", "", 1), START) is None


async def test_bleedwatch_failing_never_fails_the_proxys_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def down(_: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": "unavailable", "detail": "down"})

    client = BleedwatchClient("http://bw", "bw_x_y", batch_size=1, max_attempts=1, transport=httpx.MockTransport(down))
    logger = BleedwatchLogger(client=client, fingerprint_key=KEY)
    await logger.async_log_success_event(callback_kwargs("t", "p"), response_obj("r", "a", 1), START, START)
    # Handed to the SDK, which neither waits for the service nor raises into the proxy's call.
    assert (logger.submitted, logger.errors) == (1, 0)
    await logger.async_log_failure_event({}, None, START, START)
    with pytest.raises(Undelivered):
        await client.aclose()  # no spool: the last flush says what it could not deliver

    for var in ("BLEEDWATCH_URL", "BLEEDWATCH_API_KEY", "BLEEDWATCH_FINGERPRINT_KEY"):
        monkeypatch.delenv(var, raising=False)
    unconfigured = BleedwatchLogger()
    await unconfigured.async_log_success_event(callback_kwargs("t", "p"), response_obj("r", "a", 1), START, START)
    assert (unconfigured.submitted, unconfigured.skipped, unconfigured.errors) == (0, 1, 0)


async def test_a_key_that_is_no_key_is_said_once_and_not_echoed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A key of 8 bytes would fail every exchange's fingerprints one by one; it is a configuration error."""
    monkeypatch.setenv("BLEEDWATCH_URL", "http://bw")
    monkeypatch.setenv("BLEEDWATCH_API_KEY", "bw_x_y")
    monkeypatch.setenv("BLEEDWATCH_FINGERPRINT_KEY", "0badc0ffee0ddf00")
    logger = BleedwatchLogger()
    for _ in range(2):
        await logger.async_log_success_event(callback_kwargs("t", "p"), response_obj("r", "a", 1), START, START)
    assert (logger.submitted, logger.skipped, logger.errors) == (0, 2, 0)
    said = [r.getMessage() for r in caplog.records if "not configured" in r.getMessage()]
    assert len(said) == 1
    assert "must be 16 to 64 bytes" in said[0]
    assert "0badc0ffee" not in said[0]


def test_every_call_types_answer_and_prompt_are_read() -> None:
    """The shapes litellm 1.110.2 hands its hooks for each covered call type (as the real test saw them)."""
    normalised = [{"role": "user", "content": "the prompt"}]

    def slo_only(call_type: str, **extra: Any) -> dict[str, Any]:
        kwargs = callback_kwargs("t", "unused", call_type=call_type, messages=normalised) | {"call_type": call_type}
        del kwargs["messages"]  # text completions and the Responses API have none of their own
        return kwargs | extra

    text = SimpleNamespace(id="cmpl-1", choices=[SimpleNamespace(index=0, text="a text answer")], usage=None)
    got = exchange_from_callback(slo_only("text_completion"), text, START)
    assert got is not None
    assert (got.prompt, got.response, got.request_id) == ("the prompt", "a text answer", call_id("t", "unused"))

    responses = {
        "id": "resp_1",
        "output": [
            {"type": "reasoning", "content": None},
            {"type": "message", "content": [{"type": "output_text", "text": "a responses answer"}]},
        ],
        "usage": {"input_tokens": 321},
    }
    kwargs = slo_only("aresponses", optional_params={"instructions": "be brief"})
    got = exchange_from_callback(kwargs | {"async_complete_streaming_response": responses}, None, START)
    assert got is not None
    assert (got.prompt, got.response, got.meta["prompt_tokens"]) == (
        "be brief\n\nthe prompt",
        "a responses answer",
        321,
    )

    anthropic = {"id": "msg_1", "content": [{"type": "text", "text": "an anthropic answer"}, {"type": "tool_use"}]}
    got = exchange_from_callback(slo_only("anthropic_messages", optional_params={"system": "sys"}), anthropic, START)
    assert got is not None
    assert (got.prompt, got.response) == ("sys\n\nthe prompt", "an anthropic answer")

    too_long = exchange_from_callback(
        slo_only("responses", litellm_call_id="call-1"),
        {"id": "r" * 300} | {"output": [{"type": "message", "content": [{"type": "output_text", "text": "a"}]}]},
        START,
    )
    assert too_long is not None
    assert too_long.request_id == "call-1"


async def test_calls_a_provider_gives_one_id_are_each_sent() -> None:
    """Ollama numbers its answers chatcmpl-0 to 998: two calls with one provider id are two exchanges."""
    sent: list[str] = []

    def take(request: httpx.Request) -> httpx.Response:
        sent.extend(ex["request_id"] for ex in orjson.loads(request.content)["exchanges"])
        return httpx.Response(202, json={"accepted": len(sent), "duplicates": 0, "results": []})

    client = BleedwatchClient("http://bw", "bw_x_y", flush_seconds=3600, transport=httpx.MockTransport(take))
    logger = BleedwatchLogger(client=client, fingerprint_key=KEY)
    for prompt in ("first question", "second question"):
        await logger.async_log_success_event(
            callback_kwargs("t", prompt), response_obj("chatcmpl-7", "a", 1), START, START
        )
    await logger.aclose()
    assert (logger.submitted, logger.skipped) == (2, 0)
    assert sent == [call_id("t", "first question"), call_id("t", "second question")]


def test_the_hooks_never_wait_for_a_client_being_built() -> None:
    """Building a client reads a whole spool left by an outage (seconds for 1 GB) under the
    logger's lock; the hooks' dedup runs on the proxy's event loop and must not wait for it."""
    logger = BleedwatchLogger(client=BleedwatchClient("http://bw", "bw_x_y"), fingerprint_key=KEY)
    exchange = exchange_from_callback(callback_kwargs("t", "p"), response_obj("r", "a", 1), START)
    assert exchange is not None
    seen: list[bool] = []
    with logger._lock:  # the loop thread, building a client
        hook = threading.Thread(target=lambda: seen.append(logger._first_time(exchange)))
        hook.start()
        hook.join(5)
    assert seen == [True]


async def test_an_exchange_litellm_reports_twice_is_sent_once() -> None:
    sent: list[int] = []

    def take(request: httpx.Request) -> httpx.Response:
        sent.append(len(orjson.loads(request.content)["exchanges"]))
        return httpx.Response(202, json={"accepted": sent[-1], "duplicates": 0, "results": []})

    client = BleedwatchClient("http://bw", "bw_x_y", flush_seconds=3600, transport=httpx.MockTransport(take))
    logger = BleedwatchLogger(client=client, fingerprint_key=KEY)
    for _ in range(2):  # a sync stream: LiteLLM calls both hooks with the same answer
        await logger.async_log_success_event(callback_kwargs("t", "p"), response_obj("r", "a", 1), START, START)
    assert (logger.submitted, logger.skipped) == (1, 1)
    await logger.aclose()
    assert sent == [1]


async def test_an_unusable_spool_directory_leaves_checking_on(tmp_path: Path) -> None:
    """A BLEEDWATCH_SPOOL_DIR that is a file (or read-only): exchanges are sent without a spool,
    not all refused with an error each."""
    (tmp_path / "not-a-dir").write_text("")
    logger = BleedwatchLogger("http://127.0.0.1:9", "bw_x_y", KEY, spool_dir=tmp_path / "not-a-dir")
    for prompt in ("one", "two"):
        await logger.async_log_success_event(callback_kwargs("t", prompt), response_obj("r", "a", 1), START, START)
    assert (logger.submitted, logger.errors) == (2, 0)
    with contextlib.suppress(Undelivered):
        await logger.aclose()


def test_each_worker_claims_a_spool_of_its_own(tmp_path: Path) -> None:
    """The slot's flock is held for the process's life: a second worker gets the next slot, and a
    replacement for a dead worker gets the freed one (and replays what it left)."""
    script = (
        "import sys, time; from bleedwatch.litellm import claim_spool; "
        "print(claim_spool(sys.argv[1])[0], flush=True); time.sleep(60)"
    )
    with subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == str(tmp_path / "worker-0.spool")
            path, fd = claim_spool(tmp_path)
            assert path == tmp_path / "worker-1.spool"
            os.close(fd)
        finally:
            holder.kill()
    path, fd = claim_spool(tmp_path)
    assert path == tmp_path / "worker-0.spool"
    os.close(fd)
