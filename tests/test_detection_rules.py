"""Each suppression rule and the canary rule, end to end on every backend."""

from __future__ import annotations

import time
from typing import Any

import pytest

from service.auth.keys import Role
from service.fingerprint.encoding import U32_LE, U64_LE, encode
from service.fingerprint.scheme import DEFAULT_PARAMS, Params, key_id
from service.fingerprint.tokens import tokenize
from service.probe import UNSAMPLED, canary_text
from service.sdk.exchange import fingerprint_exchange
from tests.conftest import Api
from tests.traffic import KEY, fp, words
from tests.traffic import exchange as ex

pytestmark = pytest.mark.anyio

NS = key_id(KEY, DEFAULT_PARAMS)
LICENSE = words("unittest", 80, 200)  # stands in for public text many tenants quote


async def post(api: Api, *exchanges: dict[str, Any]) -> dict[str, Any]:
    resp = await api.client.post("/v1/exchanges", json={"exchanges": list(exchanges)}, headers=api.headers(Role.INGEST))
    assert resp.status_code == 202, resp.text
    result: dict[str, Any] = resp.json()
    return result


async def findings(api: Api) -> list[dict[str, Any]]:
    resp = await api.client.get("/v1/findings", headers=api.headers(Role.READ))
    items: list[dict[str, Any]] = resp.json()["items"]
    return items


async def admin(api: Api, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    resp = await api.client.request(method, path, headers=api.headers(Role.ADMIN), **kwargs)
    assert resp.status_code in (200, 201), resp.text
    data: dict[str, Any] = resp.json()
    return data


async def test_text_of_many_tenants_is_boilerplate(api: Api) -> None:
    now = time.time()
    for i in range(3):  # common_tenants = 3
        await post(
            api, ex(f"t{i}", f"r{i}", LICENSE + " " + words("csv", 50 * i, 50 * i + 40), words("json", 0, 30), now)
        )
    await post(api, ex("t9", "r9", words("heapq"), "Quoting: " + LICENSE, now))
    assert await findings(api) == []


async def test_two_tenants_are_not_yet_boilerplate(api: Api) -> None:
    now = time.time()
    await post(api, ex("t0", "r0", LICENSE, words("json", 0, 30), now))
    await post(api, ex("t9", "r9", words("heapq"), "Quoting: " + LICENSE, now))
    assert [f["source_tenant"] for f in await findings(api)] == ["t0"]


async def test_the_recipients_own_earlier_prompt_is_self_echo(api: Api) -> None:
    now = time.time()
    await post(api, ex("a", "a1", words("argparse"), words("json", 0, 30), now))
    await post(api, ex("b", "b1", "Here is some text: " + words("argparse", 50, 120), words("csv", 0, 40), now))
    await post(api, ex("b", "b2", words("heapq"), words("argparse", 60, 110), now))  # echoes b1, not a1
    assert await findings(api) == []


async def test_allowlisted_text_never_makes_a_finding_until_revoked(api: Api) -> None:
    now = time.time()
    entry = await admin(
        api,
        "POST",
        "/v1/allowlist",
        json={"key_id": NS, "label": "public text", "fingerprints": encode(fp(LICENSE).values, U64_LE)},
    )
    assert entry["fingerprint_count"] == len(set(fp(LICENSE).values.tolist()))
    await post(api, ex("a", "a1", LICENSE, words("json", 0, 30), now))
    await post(api, ex("b", "b1", words("heapq"), LICENSE, now))
    assert await findings(api) == []
    listed = await admin(api, "GET", "/v1/allowlist")
    assert [e["id"] for e in listed["items"]] == [entry["id"]]
    revoked = await admin(api, "DELETE", f"/v1/allowlist/{entry['id']}")
    assert revoked["revoked_at"] is not None
    await post(api, ex("b", "b2", words("heapq"), LICENSE, now))
    assert [f["recipient_request_id"] for f in await findings(api)] == ["b2"]


async def test_a_canary_in_anyone_elses_answer_is_critical(api: Api) -> None:
    now = time.time()
    canary = canary_text(300)
    cfp = fp(canary, UNSAMPLED)
    text = {
        "fingerprints": encode(cfp.values, U64_LE),
        "offsets": encode(cfp.offsets, U32_LE),
        "token_count": cfp.token_count,
    }
    made = await admin(
        api, "POST", "/v1/canaries", json={"key_id": NS, "tenant": "canary", "label": "p1", "text": text}
    )
    # The canary tenant's own traffic, and three tenants quoting the canary: it must not become common.
    await post(api, ex("canary", "c1", canary, words("json", 0, 30), now))
    for i in range(3):
        await post(api, ex(f"q{i}", f"q{i}", canary, words("csv", 40 * i, 40 * i + 30), now))
    assert await findings(api) == []
    leaked = " ".join(canary.split()[100:130])  # 30 tokens
    await post(api, ex("victim", "v1", words("heapq"), words("difflib", 0, 40) + " " + leaked, now))
    (f,) = await findings(api)
    assert (f["recipient_tenant"], f["source_tenant"], f["severity"]) == ("victim", "canary", "critical")
    assert f["source_request_ids"] == ["canary:p1"]
    (rng,) = f["evidence"]["sources"][0]["ranges"]
    assert rng["source_kind"] == "canary"
    assert 90 <= rng["source"][0] <= 110
    await admin(api, "DELETE", f"/v1/canaries/{made['id']}")
    assert [c["revoked_at"] is not None for c in (await admin(api, "GET", "/v1/canaries"))["items"]] == [True]


async def test_a_million_token_prompt_is_sampled_and_still_leaks(api: Api) -> None:
    now = time.time()
    filler = canary_text(1_000_000).split()
    leak = words("argparse", 0, 300)
    prompt = " ".join(filler[:900_000]) + " " + leak + " " + " ".join(filler[900_000:])
    long = ex("a", "a-long", prompt, words("json", 0, 30), now)
    assert long["prompt"]["token_count"] > 1_000_000
    await post(api, long)
    await post(api, ex("b", "b1", words("heapq"), words("csv", 0, 30) + " " + " ".join(leak.split()[100:250]), now))
    (f,) = await findings(api)
    assert (f["source_tenant"], f["source_request_ids"], f["recipient_tenant"]) == ("a", ["a-long"], "b")
    assert f["longest_run_words"] >= 64  # 150 words, seen through 1-in-4 sampling at the edges


async def test_canary_traffic_marks_the_probe_loop_alive(api: Api) -> None:
    canary = canary_text(100)
    cfp = fp(canary, UNSAMPLED)
    text = {
        "fingerprints": encode(cfp.values, U64_LE),
        "offsets": encode(cfp.offsets, U32_LE),
        "token_count": cfp.token_count,
    }
    await admin(api, "POST", "/v1/canaries", json={"key_id": NS, "tenant": "canary", "label": "p2", "text": text})
    before = time.time()
    await post(api, ex("canary", "c9", canary, words("json", 0, 30), before))
    body = (await api.client.get("/metrics")).text
    (line,) = [x for x in body.splitlines() if x.startswith("bleedwatch_canary_last_seen_timestamp_seconds")]
    assert float(line.split()[-1]) >= before - 1


async def test_list_changes_are_audited(api: Api) -> None:
    entry = await admin(
        api,
        "POST",
        "/v1/allowlist",
        json={"key_id": NS, "label": "x", "fingerprints": encode(fp(LICENSE).values, U64_LE)},
    )
    await admin(api, "DELETE", f"/v1/allowlist/{entry['id']}")
    cfp = fp(canary_text(50), UNSAMPLED)
    text = {
        "fingerprints": encode(cfp.values, U64_LE),
        "offsets": encode(cfp.offsets, U32_LE),
        "token_count": cfp.token_count,
    }
    canary = await admin(
        api, "POST", "/v1/canaries", json={"key_id": NS, "tenant": "canary", "label": "a", "text": text}
    )
    await admin(api, "DELETE", f"/v1/canaries/{canary['id']}")
    actions = [e["action"] for e in (await admin(api, "GET", "/v1/audit", params={"limit": 50}))["items"]]
    for action in ("allowlist.add", "allowlist.revoke", "canaries.register", "canaries.revoke"):
        assert action in actions


def every_shingle(tenant: str, prompt: str, response: str) -> dict[str, Any]:
    """An exchange fingerprinted with w = 1, request id ``<tenant>1``."""
    return fingerprint_exchange(
        prompt, response, key=KEY, tenant=tenant, request_id=f"{tenant}1", model="m", ts=time.time(), params=Params(w=1)
    )


async def test_with_every_shingle_a_copy_is_judged_by_its_exact_length(api: Api) -> None:
    # w = 1: a run is as long as the copy, so the bar is 12 tokens (exact_min_run_tokens), not 10.
    source = tokenize(words("argparse", 0, 300))

    await post(api, every_shingle("a", " ".join(source), words("json", 0, 30)))
    await post(api, every_shingle("b", words("heapq"), "zq " + " ".join(source[50:62]) + " qz"))  # 12 tokens
    await post(api, every_shingle("c", words("csv"), "zq " + " ".join(source[120:131]) + " qz"))  # 11 tokens
    # A template's slot filled with three other words: 7 and 5 tokens around it, 6 of 12 shingles
    # (below exact_long_run_purity; winnowed at w = 5, a run of six would count).
    template = [*source[200:207], "zq", "qz", "zq", *source[210:215]]
    await post(api, every_shingle("d", words("difflib"), "zz " + " ".join(template) + " zz"))
    assert [(f["recipient_tenant"], f["longest_run_words"]) for f in await findings(api)] == [("b", 12)]


async def test_with_every_shingle_a_copy_may_begin_with_a_phrase_its_source_said_before(api: Api) -> None:
    # The index knows a phrase at its first place in a prompt: a copy of the phrase's second
    # place is a run pointing there, then one pointing at the second place (11 tokens alone).
    phrase, after = words("difflib", 0, 5), words("csv", 0, 8)
    prompt = " ".join([words("argparse", 0, 100), phrase, words("argparse", 100, 200), phrase, after])

    await post(api, every_shingle("a", prompt, words("json", 0, 30)))
    await post(api, every_shingle("b", words("heapq"), f"zq {phrase} {after} qz"))  # 4 + 8 tokens
    assert [(f["source_tenant"], f["longest_run_words"]) for f in await findings(api)] == [("a", 12)]


async def common(api: Api, text: str) -> None:
    """Makes ``text`` boilerplate: three tenants (``common_tenants``) send it, between words of their own."""
    for i in range(3):
        await post(api, every_shingle(f"t{i}", f"{words('unittest', 300 + 10 * i, 310 + 10 * i)} zz {text} zz", "ok"))


async def test_with_every_shingle_common_text_at_the_seam_of_a_repeated_phrase_does_not_part_the_copy(
    api: Api,
) -> None:
    # As above, with a 5-token phrase, and the shingle across its seam with the rest of the copy
    # ("helpers for computing csv") common: the rest starts a token past touching the phrase.
    phrase, after = words("difflib", 0, 6), words("csv", 0, 8)
    prompt = " ".join([words("argparse", 0, 100), phrase, words("argparse", 100, 200), phrase, after])
    await common(api, " ".join([*tokenize(phrase)[2:], tokenize(after)[0]]))

    await post(api, every_shingle("a", prompt, words("json", 0, 30)))
    # 5 + 8 tokens, 10 without the phrase
    await post(api, every_shingle("b", words("heapq"), f"zq {phrase} {after} qz"))
    assert [(f["source_tenant"], f["longest_run_words"]) for f in await findings(api)] == [("a", 13)]


async def test_with_every_shingle_an_interleaved_fragment_of_common_text_does_not_part_the_copy(api: Api) -> None:
    # 16 tokens of the prompt cut into 6 + 4 + 6 with other words between; the middle fragment's
    # one shingle is common text, so the outer two are 4 source tokens apart.
    span = tokenize(words("argparse", 0, 300))[50:66]
    first, middle, last = " ".join(span[:6]), " ".join(span[6:10]), " ".join(span[10:])
    await common(api, middle)

    await post(api, every_shingle("a", words("argparse", 0, 300), words("json", 0, 30)))
    response = f"zq {first} {words('heapq', 0, 9)} {middle} {words('csv', 0, 9)} {last} qz"
    await post(api, every_shingle("b", words("difflib"), response))
    assert [(f["source_tenant"], f["longest_run_words"]) for f in await findings(api)] == [("a", 12)]
