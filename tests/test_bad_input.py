"""Bad input gets a clear 4xx in the one error shape, names the field, echoes no data."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from service.auth.keys import Role
from service.config import Settings
from tests.conftest import Api, running_api
from tests.incident_traffic import leak_pair
from tests.traffic import exchange, words

pytestmark = pytest.mark.anyio


@pytest.fixture
async def small_api(settings: Settings) -> AsyncIterator[Api]:
    limited = settings.model_copy(
        update={"max_body_bytes": 64 * 1024, "max_batch_exchanges": 3, "max_fingerprints_per_text": 300}
    )
    async with running_api(limited) as api:
        yield api


def one(**changes: Any) -> dict[str, Any]:
    ex = exchange("acme", "r-1", words("argparse"), words("csv", 0, 60), time.time())
    for path, value in changes.items():
        target = ex
        *parents, leaf = path.split("__")
        for p in parents:
            target = target[p]
        target[leaf] = value
    return ex


async def post(
    api: Api, body: bytes | dict[str, Any], role: Role | None = Role.INGEST, content_type: str = "application/json"
) -> tuple[int, dict[str, Any]]:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    headers = api.headers(role) | {"Content-Type": content_type}
    resp = await api.client.post("/v1/exchanges", content=raw, headers=headers)
    data: dict[str, Any] = resp.json()
    assert set(data) == {"error", "detail"} or resp.status_code == 202, data
    return resp.status_code, data


async def test_no_key_is_401(small_api: Api) -> None:
    status, body = await post(small_api, {"exchanges": [one()]}, role=None)
    assert status == 401
    assert "Authorization: Bearer" in body["detail"]
    resp = await small_api.client.get("/v1/findings", headers={"Authorization": "Bearer bw_nope_nope"})
    assert resp.status_code == 401
    assert resp.json()["error"] == "unauthorized"


@pytest.mark.parametrize("role", [Role.READ, Role.TRIAGE, Role.ADMIN])
async def test_only_ingest_keys_ingest(small_api: Api, role: Role) -> None:
    status, body = await post(small_api, {"exchanges": [one()]}, role=role)
    assert status == 403
    assert f"role '{role.value}'" in body["detail"]


async def test_ingest_keys_cannot_read(small_api: Api) -> None:
    for path in ("/v1/findings", "/v1/findings/1"):
        resp = await small_api.client.get(path, headers=small_api.headers(Role.INGEST))
        assert resp.status_code == 403, path
        assert "needs one of: admin, read, triage" in resp.json()["detail"]


async def test_oversized_body_is_413(small_api: Api) -> None:
    big = [one(request_id="big", prompt__fingerprints=base64.b64encode(bytes(80 * 1024)).decode())]
    status, body = await post(small_api, {"exchanges": big})
    assert status == 413
    assert "BLEEDWATCH_MAX_BODY_BYTES" in body["detail"]


async def test_oversized_batch_is_413(small_api: Api) -> None:
    status, body = await post(small_api, {"exchanges": [one(request_id=f"r-{i}") for i in range(4)]})
    assert status == 413
    assert "4 in one batch" in body["detail"]


async def test_too_many_fingerprints_is_413(small_api: Api) -> None:
    long_prompt = " ".join(words(name) for name in ("argparse", "csv", "json", "socket", "http"))
    many = exchange("acme", "r-1", long_prompt, "x", time.time())
    status, body = await post(small_api, {"exchanges": [many]})
    assert status == 413
    assert body["detail"].startswith("exchanges[0].prompt.fingerprints:")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"prompt__fingerprints": "not base64!"}, "exchanges[0].prompt.fingerprints"),
        ({"prompt__fingerprints": base64.b64encode(b"1234567").decode()}, "exchanges[0].prompt.fingerprints"),
        ({"response__offsets": base64.b64encode(b"\0" * 4).decode()}, "exchanges[0].response"),
        (
            {"response__fingerprints": [1], "response__offsets": [0, 1]},
            "exchanges[0].response: 1 fingerprint but 2 offsets; they must pair up",
        ),
        ({"response__token_count": 3}, "exchanges[0].response.offsets"),
        ({"prompt__fingerprints": [-1]}, "exchanges[0].prompt.fingerprints"),
        ({"tenant": ""}, "exchanges[0].tenant"),
        ({"tenant": "a\nb"}, "exchanges[0].tenant"),
        # A line break in log viewers too; said in words, not as the pattern's 400 characters.
        ({"tenant": "a\u2028b"}, "exchanges[0].tenant: no control, format (zero-width, bidi) or line-separator"),
        ({"scheme__version": True}, "exchanges[0].scheme.version"),
        ({"key_id": "KEY"}, "exchanges[0].key_id"),
        ({"ts": "yesterday"}, "exchanges[0].ts"),
        ({"ts": time.time() + 86400}, "exchanges[0].ts"),
        # Gateways send JSON numbers: a numeric string or an integral float is a client's bug, not coerced.
        ({"ts": str(int(time.time()))}, "exchanges[0].ts: give epoch seconds as a JSON number, not a string"),
        ({"ts": f"{time.time():e}"}, "exchanges[0].ts: give epoch seconds as a JSON number, not a string"),
        ({"scheme__n": 4.0}, "exchanges[0].scheme.n: give a JSON integer"),
        ({"scheme__version": 1.0}, "exchanges[0].scheme.version: give a JSON integer"),
        ({"prompt__token_count": 100000.0}, "exchanges[0].prompt.token_count: give a JSON integer"),
        ({"meta__prompt_tokens": 12.0}, "exchanges[0].meta.prompt_tokens: give a JSON integer"),
        ({"meta__prompt_tokens": "12"}, "exchanges[0].meta.prompt_tokens: give a JSON integer"),
        ({"response__fingerprints": [1.0], "response__offsets": [0]}, "exchanges[0].response.fingerprints"),
        ({"response__fingerprints": [1], "response__offsets": [0.0]}, "exchanges[0].response.offsets"),
        ({"meta__deployment": {"nested": 1}}, "exchanges[0].meta.deployment"),
        ({"surprise": 1}, "exchanges[0].surprise: not a field of the schema"),
    ],
)
async def test_malformed_exchange_is_422_naming_the_field(small_api: Api, changes: dict[str, Any], field: str) -> None:
    status, body = await post(small_api, {"exchanges": [one(**changes)]})
    assert status == 422, body
    assert body["error"] == "invalid"
    assert field in body["detail"]


async def test_errors_do_not_echo_the_payload(small_api: Api) -> None:
    secret_ish = base64.b64encode(b"\x01" * 8).decode()[:-1]  # invalid padding
    status, body = await post(small_api, {"exchanges": [one(prompt__fingerprints=secret_ish, tenant="x" * 200)]})
    assert status == 422
    assert secret_ish not in body["detail"]
    assert "x" * 50 not in body["detail"]
    # A field's name is the caller's too: text pasted as a key is not sent back, at any depth.
    pasted = "Patient John Doe SSN 078-05-1120"
    for batch in (
        {"exchanges": [one()], pasted: 1},
        {"exchanges": [one(), one(request_id="r-2", **{pasted: 1})]},
        {"exchanges": [one(meta={"deployment": "d", pasted: 1})]},
        {"exchanges": [one(meta={"deployment": "d", "078051120": 1})]},  # digits are no list position
    ):
        status, body = await post(small_api, batch)
        assert status in (202, 422), body  # 202: the other exchange is taken, this one's results[i] says why not
        said = body["detail"] if status == 422 else " ".join(r["detail"] or "" for r in body["results"])
        assert "John" not in said
        assert "078051120" not in said
        assert "[…]: not a field of the schema" in said


async def test_offsets_out_of_order_and_duplicate_requests(small_api: Api) -> None:
    bad = one(
        response__offsets=base64.b64encode(bytes([5, 0, 0, 0, 1, 0, 0, 0])).decode(),
        response__fingerprints=base64.b64encode(bytes(16)).decode(),
    )
    status, body = await post(small_api, {"exchanges": [bad]})
    assert (status, "strictly increasing" in body["detail"]) == (422, True)
    status, body = await post(small_api, {"exchanges": [one(), one()]})
    assert (status, body["accepted"], body["duplicates"]) == (202, 1, 1)
    assert [r["status"] for r in body["results"]] == ["accepted", "duplicate"]


async def test_not_json_is_415_or_422(small_api: Api) -> None:
    status, body = await post(small_api, b"exchanges=1", content_type="application/x-www-form-urlencoded")
    assert status == 415
    status, body = await post(small_api, b"{not json")
    assert status == 422
    ok = orjson.dumps({"exchanges": [one()]})
    for utf8 in ("application/json; charset=utf-8", 'application/JSON;charset="UTF-8"'):
        assert (await post(small_api, ok, content_type=utf8))[0] == 202
    assert (await post(small_api, ok, content_type="application/json; charset=iso-8859-1"))[0] == 415
    status, body = await post(small_api, {"exchanges": []})
    assert status == 422
    assert "exchanges" in body["detail"]
    # Not a batch at all: refused whole, whatever its exchanges.
    for shape in ({"exchanges": [one(), 1]}, {"exchanges": [one()], "extra": 1}, [one()], {"exchange": [one()]}):
        status, body = await post(small_api, orjson.dumps(shape))
        assert (status, body["error"]) == (422, "invalid"), shape


async def test_a_batch_of_only_rejected_exchanges_keeps_nothing(small_api: Api) -> None:
    good = one(request_id="kept-out")
    status, body = await post(small_api, {"exchanges": [one(request_id="bad", key_id="zz"), one(tenant="")]})
    assert (status, body["error"]) == (422, "invalid")
    assert body["detail"].startswith("exchanges[0].key_id")  # the first one's reason
    status, body = await post(small_api, {"exchanges": [good]})
    assert status == 202
    assert (body["accepted"], body["duplicates"], body["rejected"], body["findings"]) == (1, 0, 0, 0)


async def test_one_bad_exchange_never_sinks_the_others(small_api: Api) -> None:
    """Issue 19: a 200-character tenant name once refused the whole batch, and the SDK dropped it all."""
    long_tenant = one(request_id="bad", tenant="x" * 200)
    too_many = exchange("acme", "long", " ".join(words(n) for n in ("argparse", "csv", "json")), "x", time.time())
    batch = [one(request_id="kept"), long_tenant, too_many]
    status, body = await post(small_api, {"exchanges": batch})
    assert status == 202
    assert (body["accepted"], body["duplicates"], body["rejected"], body["processed"]) == (1, 0, 2, True)
    kept, bad, large = body["results"]
    assert kept == {"status": "accepted", "error": None, "detail": None, "retry_after": None}
    assert (bad["status"], bad["error"]) == ("rejected", "invalid")
    assert bad["detail"].startswith("exchanges[1].tenant: String should have at most 128 characters")
    assert "x" * 50 not in bad["detail"]
    assert (large["status"], large["error"]) == ("rejected", "payload_too_large")
    assert large["detail"].startswith("exchanges[2].prompt.fingerprints:")
    # The one taken was indexed: sent again it is a duplicate, and the rejected one is still rejected.
    status, body = await post(small_api, {"exchanges": batch[:2]})
    assert (status, [r["status"] for r in body["results"]]) == (202, ["duplicate", "rejected"])
    assert (body["accepted"], body["duplicates"], body["rejected"]) == (0, 1, 1)
    # A valid batch part of which was ingested before: only the new exchange is queued, and processed.
    status, body = await post(small_api, {"exchanges": [one(request_id="new", ts=time.time()), batch[0]]})
    assert (status, [r["status"] for r in body["results"]]) == (202, ["accepted", "duplicate"])
    assert (body["accepted"], body["duplicates"], body["processed"]) == (1, 1, True)


async def test_token_counts_past_two_to_the_31_are_a_finding_like_any(api: Api) -> None:
    """Token counts and offsets are u32 on the wire and the sender's to choose; PostgreSQL's INTEGER
    refused 2**31 and the batch was dead-lettered, with the leak it held (migration 0011)."""
    (src, dst), rid = leak_pair("argparse", "acme", "globex", time.time(), prompt_tokens=2**31 + 7)
    dst["response"]["token_count"] = 2**32 - 1
    status, body = await post(api, {"exchanges": [src, dst]})
    assert (status, body["accepted"], body["findings"]) == (202, 2, 1), body
    findings = (await api.client.get("/v1/findings", headers=api.headers(Role.READ))).json()["items"]
    assert [(f["recipient_request_id"], f["prompt_tokens"]) for f in findings] == [(rid, 2**31 + 7)]


def raw_text(values: list[int], token_count: int | None = None) -> dict[str, Any]:
    """A text as a hostile gateway may send it: any values, at offsets 0, 1, 2, ..."""
    return {
        "fingerprints": values,
        "offsets": list(range(len(values))),
        "token_count": len(values) + 8 if token_count is None else token_count,
    }


async def test_a_small_prompt_naming_many_long_answers_costs_a_bounded_lookup(small_api: Api) -> None:
    """A prompt sharing 9 fingerprints with each of many long earlier answers had every one looked up
    in full: 900 fingerprints cost as much as 2,000,000, again with each new prompt. Earlier answers
    are judged again, most shared text first, up to one largest text plus 16 per fingerprint sent."""
    from prometheus_client import REGISTRY

    now = time.time()
    answers = [[(i + 1) * 1000 + j for j in range(300)] for i in range(12)]  # 300: small_api's largest text
    for start in range(0, 12, 3):
        planted = [
            one(
                tenant="big",
                request_id=f"big-{i}",
                ts=now - 60,
                prompt=raw_text([7 + i]),
                response=raw_text(answers[i]),
            )
            for i in range(start, start + 3)
        ]
        assert (await post(small_api, {"exchanges": planted}))[0] == 202
    shared = [v for i, answer in enumerate(answers) for v in answer[: 9 + i]]  # answer i shares 9 + i
    skipped = REGISTRY.get_sample_value("bleedwatch_match_earlier_skipped_total") or 0
    trigger = one(tenant="late", request_id="late-1", ts=now, prompt=raw_text(shared), response=raw_text([5, 6]))
    status, body = await post(small_api, {"exchanges": [trigger]})
    assert (status, body["processed"]) == (202, True)
    # 300 + 16 * (174 + 2) fingerprints: 10 answers of 300, those sharing the most.
    assert REGISTRY.get_sample_value("bleedwatch_match_earlier_skipped_total") == skipped + 2
    findings = (await small_api.client.get("/v1/findings", headers=small_api.headers(Role.READ))).json()["items"]
    assert sorted(f["recipient_request_id"] for f in findings) == sorted(f"big-{i}" for i in range(2, 12))


async def test_a_response_of_one_value_repeated_is_judged_and_each_value_looked_up_once(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model stuck repeating a phrase, or a gateway choosing its values: 20,000 fingerprints of one
    value, which another tenant's prompt holds, make every match a piece of its own (seconds per
    100,000 once). The same shingle over and over copies 4 tokens, no finding; the ten shingles of
    the other tenant's prompt over and over copy its 13 tokens each time, a finding. The index is
    asked about each distinct value once, not once per fingerprint."""
    index = api.app.state.deps.index
    asked: list[int] = []
    lookup = index.lookup

    async def counted(key_id: str, values: Any, now: float) -> Any:
        asked.append(len(values))
        return await lookup(key_id, values, now)

    monkeypatch.setattr(index, "lookup", counted)
    now = time.time()
    sent = [10**12 + 7 * k for k in range(10)]
    source = one(tenant="other", request_id="other-1", ts=now - 60, prompt=raw_text(sent), response=raw_text([5, 6]))
    assert (await post(api, {"exchanges": [source]}))[0] == 202
    stuck = one(
        tenant="acme", request_id="stuck", ts=now - 30, prompt=raw_text([1]), response=raw_text([sent[0]] * 20_000)
    )
    status, body = await post(api, {"exchanges": [stuck]})
    assert (status, body["processed"], body["findings"]) == (202, True, 0)
    loop = [sent[i % len(sent)] for i in range(20_000)]
    cycling = one(tenant="acme", request_id="cycling", ts=now, prompt=raw_text([2]), response=raw_text(loop))
    status, body = await post(api, {"exchanges": [cycling]})
    assert (status, body["processed"], body["findings"]) == (202, True, 1)
    assert 0 < max(asked) <= len(sent)
    findings = (await api.client.get("/v1/findings", headers=api.headers(Role.READ))).json()["items"]
    assert [(f["recipient_request_id"], f["source_tenant"]) for f in findings] == [("cycling", "other")]
