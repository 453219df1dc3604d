"""Each suppression rule and the canary rule, end to end on every backend."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from bleedwatch.exchange import fingerprint_exchange
from bleedwatch.fingerprint.encoding import U32_LE, U64_LE, encode
from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS, Params, key_id
from bleedwatch.fingerprint.tokens import tokenize
from service.auth.keys import Role
from service.tools.probe import UNSAMPLED, canary_text
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
    for i, answer in enumerate(("json", "sqlite3", "subprocess")):  # common_tenants = 3
        await post(
            api, ex(f"t{i}", f"r{i}", LICENSE + " " + words("csv", 50 * i, 50 * i + 40), words(answer, 0, 30), now)
        )
    await post(api, ex("t9", "r9", words("heapq"), "Quoting: " + LICENSE, now))
    assert await findings(api) == []


async def test_text_one_other_tenant_sent_is_not_yet_boilerplate(api: Api) -> None:
    now = time.time()
    await post(api, ex("t0", "r0", LICENSE, words("json", 0, 30), now))
    await post(api, ex("t9", "r9", words("heapq"), "Quoting: " + LICENSE, now))
    assert [f["source_tenant"] for f in await findings(api)] == ["t0"]


async def test_text_two_tenants_each_sent_is_no_ones_secret(api: Api) -> None:
    now = time.time()
    secret = words("argparse", 0, 60)
    await post(api, ex("t0", "r0", LICENSE + " " + secret, words("json", 0, 30), now))
    await post(api, ex("t1", "r1", "See: " + LICENSE, words("csv", 0, 30), now))
    await post(api, ex("t9", "r9", words("heapq"), "Quoting: " + LICENSE, now))
    assert await findings(api) == []
    # What only one of them sent is still that one's.
    await post(api, ex("t8", "r8", words("heapq"), "Quoting: " + LICENSE + " " + secret, now))
    assert [(f["recipient_tenant"], f["source_tenant"]) for f in await findings(api)] == [("t8", "t0")]


async def test_a_leak_its_recipients_sent_back_is_still_found_in_the_next_answers(api: Api) -> None:
    """t0's prompt leaks into v1's answer, and v1's chat sends it back in its next turn; then into v2's,
    whose chat does the same. Each was served the text before it sent it: no second or third sender
    that would make it no one's secret, or common, so the leaks into v2 and v3 are found too."""
    now = time.time()
    secret = words("argparse", 0, 60)
    await post(api, ex("t0", "r0", secret, words("json", 0, 30), now))
    for i, topic in ((1, "heapq"), (2, "csv"), (3, "sqlite3")):
        await post(api, ex(f"v{i}", f"v{i}", words(topic, 0, 30), "Here: " + secret, now + i))
        turn = words(topic, 0, 30) + " Here: " + secret + " what is this?"
        await post(api, ex(f"v{i}", f"v{i}-next", turn, words("difflib", 30 * i, 30 * i + 30), now + i + 0.5))
    found = sorted((f["recipient_tenant"], f["recipient_request_id"], f["source_tenant"]) for f in await findings(api))
    assert found == [("v1", "v1", "t0"), ("v2", "v2", "t0"), ("v3", "v3", "t0")]


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


async def register_canary(api: Api, canary: str) -> dict[str, Any]:
    """``canary`` registered for tenant ``canary`` under label p1, every shingle (as the probe does)."""
    cfp = fp(canary, UNSAMPLED)
    text = {
        "fingerprints": encode(cfp.values, U64_LE),
        "offsets": encode(cfp.offsets, U32_LE),
        "token_count": cfp.token_count,
    }
    return await admin(
        api, "POST", "/v1/canaries", json={"key_id": NS, "tenant": "canary", "label": "p1", "text": text}
    )


async def test_a_canary_in_anyone_elses_answer_is_critical(api: Api) -> None:
    now = time.time()
    canary = canary_text(300)
    made = await register_canary(api, canary)
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
    assert f["longest_run_tokens"] >= 64  # 150 words, seen through 1-in-4 sampling at the edges


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


ANSWER = words("socket", 0, 80)  # what the model told tenant a: in no prompt of anyone's


@pytest.mark.parametrize("arrival", ["source first", "recipient first"])
async def test_another_tenants_answer_is_a_source_and_the_earlier_answer_is_it(api: Api, arrival: str) -> None:
    now = time.time()
    source = ex("a", "a1", words("heapq"), ANSWER, now - 10)
    recipient = ex("b", "b1", words("csv", 0, 40), words("json", 0, 30) + " " + " ".join(ANSWER.split()[10:40]), now)
    for e in (source, recipient) if arrival == "source first" else (recipient, source):
        await post(api, e)
    (f,) = await findings(api)
    assert (f["recipient_tenant"], f["source_tenant"], f["source_request_ids"]) == ("b", "a", ["a1"])
    assert {r["source_kind"] for r in f["evidence"]["sources"][0]["ranges"]} == {"response"}


async def test_an_answer_several_tenants_were_served_is_the_models_own(api: Api) -> None:
    now = time.time()
    await post(api, ex("a", "a1", words("heapq"), ANSWER, now - 20))
    await post(api, ex("b", "b1", words("csv", 0, 40), ANSWER, now - 10))
    await post(api, ex("c", "c1", words("difflib", 0, 40), ANSWER, now))
    assert "c" not in {f["recipient_tenant"] for f in await findings(api)}


async def test_text_someone_sent_came_from_that_prompt_whoever_was_served_it(api: Api) -> None:
    now = time.time()
    await post(api, ex("a", "a1", words("argparse", 0, 200), words("json", 0, 30), now - 20))
    await post(api, ex("b", "b1", words("heapq"), words("argparse", 50, 120), now - 10))
    await post(api, ex("c", "c1", words("csv", 0, 40), words("argparse", 60, 110), now))
    assert {(f["recipient_tenant"], f["source_tenant"]) for f in await findings(api)} == {("b", "a"), ("c", "a")}


def _twelve_tokens_the_prompt_shows_short(prompt: str) -> str:
    """12 tokens of ``prompt`` of whose 9 shingles its winnowing keeps neither the first nor the last, but
    two 5 to 8 apart: a copy the prompt alone shows as an 8- to 11-token stretch, scoring under 9."""
    tokens = tokenize(prompt)
    kept = set(fp(prompt, DEFAULT_PARAMS).offsets.tolist())
    grams = Counter(tuple(tokens[i : i + 4]) for i in range(len(tokens) - 3))
    for start in range(len(tokens) - 12):
        inside = sorted(kept & set(range(start, start + 9)))
        once = all(grams[tuple(tokens[i : i + 4])] == 1 for i in range(start, start + 9))  # no phrase it repeats
        if once and inside and 4 <= inside[-1] - inside[0] < 8:
            return " ".join(tokens[start : start + 12])
    raise AssertionError("no such 12 tokens")


@pytest.mark.parametrize("echoed", [True, False])
async def test_an_answer_echoing_the_sources_prompt_fills_in_what_its_winnowing_left_out(
    api: Api, echoed: bool
) -> None:
    """a's prompt keeps about one shingle in two; the answer a was served that repeats it keeps every one.
    Both are a's text, so a 12-token copy of it is a finding, although a's prompt alone shows less."""
    now = time.time()
    prompt = words("argparse", 0, 200)
    answer = "As you wrote: " + prompt if echoed else words("json", 0, 30)
    await post(api, ex("a", "a1", prompt, answer, now - 10))
    leak = _twelve_tokens_the_prompt_shows_short(prompt)
    await post(api, ex("b", "b1", words("heapq"), f"{words('csv', 0, 30)} {leak} {words('difflib', 0, 30)}", now))
    found = await findings(api)
    assert [(f["recipient_tenant"], f["source_tenant"]) for f in found] == ([("b", "a")] if echoed else [])
    if echoed:  # each of the 9 shingles counted once; the ranges say where each document holds the text
        (f,) = found
        ranges = f["evidence"]["sources"][0]["ranges"]
        assert {r["source_kind"] for r in ranges} == {"prompt", "response"}
        assert sum(r["fingerprints"] for r in ranges) == f["matched_fingerprints"] == 9
        assert f["longest_run_tokens"] == 12


def _kept_at_both_ends(text: str, tokens: int) -> tuple[int, str]:
    """``tokens`` tokens of ``text`` whose first and last shingles its winnowing keeps, with no phrase the
    text repeats, and where they start: a copy the text alone shows whole, and no more."""
    words_ = tokenize(text)
    kept = set(fp(text, DEFAULT_PARAMS).offsets.tolist())
    grams = Counter(tuple(words_[i : i + 4]) for i in range(len(words_) - 3))
    for start in range(len(words_) - tokens):
        last = start + tokens - 4
        once = all(grams[tuple(words_[i : i + 4])] == 1 for i in range(start, last + 1))
        if once and start in kept and last in kept:
            return start, " ".join(words_[start : start + tokens])
    raise AssertionError(f"no such {tokens} tokens")


async def test_a_leak_right_after_the_recipients_echo_keeps_its_first_tokens(api: Api) -> None:
    """b's answer echoes 20 tokens of its prompt, then goes on with 12 tokens of a's. The echo is blind a
    few shingles past its last match (its prompt's winnowing may have left the next ones out), but
    those shingles hold the first tokens of a's text, and a's matches say whose they are: 12 tokens,
    a finding."""
    now = time.time()
    b_prompt = words("heapq", 0, 80)
    start, _ = _kept_at_both_ends(b_prompt, 20)
    echo = " ".join(tokenize(b_prompt)[start : start + 20])  # ends with a shingle b's prompt kept
    a_prompt = words("argparse", 0, 200)
    _, leak = _kept_at_both_ends(a_prompt, 12)
    await post(api, ex("a", "a1", a_prompt, words("json", 0, 30), now - 10))
    await post(api, ex("b", "b1", b_prompt, f"{words('csv', 0, 30)} {echo} {leak} {words('difflib', 0, 30)}", now))
    (f,) = await findings(api)
    assert (f["recipient_tenant"], f["source_tenant"], f["longest_run_tokens"]) == ("b", "a", 12)


@pytest.mark.parametrize(("long_prompt", "cut"), [(False, 26), (False, 40), (False, 100), (True, 26), (True, 100)])
async def test_an_echo_is_the_recipients_text_as_far_as_its_prompt_may_hide_it(
    api: Api, long_prompt: bool, cut: int
) -> None:
    """r echoes its own prompt, and its prompt keeps few fingerprints: winnowed with w = 13, or a
    quarter of them past 65,536 tokens. s holds the same text (it was served it, or sent it), every
    shingle of it. The echo may go on unseen around r's matches for up to w (or 4 w) shingles: that is
    r's, no evidence that s's text leaked. (Sampling keeps a quarter at random, so a gap can be longer:
    docs/detection.md, known limits.)"""
    now = time.time()
    text = words("unittest", 0, 120)
    params = Params(w=3) if long_prompt else Params(w=13)
    filler = " ".join(f"q{i}z" for i in range(66_000)) if long_prompt else words("heapq", 0, 40)

    def exchange(tenant: str, prompt: str, response: str, ts: float) -> dict[str, Any]:
        return fingerprint_exchange(
            prompt, response, key=KEY, tenant=tenant, request_id=f"{tenant}1", model="m", ts=ts, params=params
        )

    s_text = f"{words('json', 0, 40)} {text} {words('difflib', 0, 40)}"
    if long_prompt:
        await post(api, exchange("s", s_text, words("argparse", 0, 30), now - 10))
    else:
        await post(api, exchange("s", words("argparse", 0, 30), s_text, now - 3000))
    echo = " ".join(tokenize(text)[:cut])
    r_prompt = f"{filler} {text} {words('csv', 0, 40)}"
    await post(api, exchange("r", r_prompt, f"{words('sqlite3', 0, 30)} {echo} {words('socket', 0, 30)}", now))
    assert await findings(api) == []


async def test_a_prompt_sent_long_after_an_answer_is_not_its_source(api: Api) -> None:
    # A request lasts at most BLEEDWATCH_MAX_REQUEST_SECONDS (900): a text first sent later than that
    # after the answer was not in the pages it was generated from, whenever it arrives.
    now = time.time()
    secret, other = words("argparse", 0, 60), words("difflib", 0, 60)
    await post(api, ex("b", "b1", words("heapq"), f"Quoting: {secret} and {other}", now - 1200))
    await post(api, ex("a", "a1", secret, words("csv", 0, 30), now))  # 20 minutes after the answer
    await post(api, ex("c", "c1", other, words("json", 0, 30), now - 1200 + 60))  # a minute after: in time
    (f,) = await findings(api)
    assert (f["recipient_tenant"], f["source_tenant"]) == ("b", "c")
    assert [s["tenant"] for s in f["evidence"]["sources"]] == ["c"]


async def test_text_the_recipient_was_served_before_a_prompt_sent_it_is_not_from_that_prompt(api: Api) -> None:
    # b was served the text 20 minutes before a sent it (too long before to be its source), and is
    # served it again now: b had it first, so it did not come from a's prompt this time either.
    now = time.time()
    text = words("argparse", 0, 60)
    await post(api, ex("b", "b1", words("heapq"), f"Quoting: {text}", now - 1200))
    await post(api, ex("a", "a1", text, words("csv", 0, 30), now - 60))
    await post(api, ex("b", "b2", words("difflib", 0, 40), f"{words('json', 0, 30)} {text}", now))
    assert await findings(api) == []
    # A tenant that was not served it before is a recipient of a's text like any other.
    await post(api, ex("c", "c1", words("sqlite3", 0, 40), f"{words('json', 0, 30)} {text}", now))
    assert [(f["recipient_tenant"], f["source_tenant"]) for f in await findings(api)] == [("c", "a")]


async def test_an_answer_that_echoes_the_recipients_winnowed_prompt_is_its_own_text(api: Api) -> None:
    # The prompt keeps about one shingle in three; the echo's other shingles are also in the
    # answer a earlier got from it (a leak), and must not make that answer b's source.
    now = time.time()
    await post(api, ex("b", "b1", words("argparse", 0, 200), words("json", 0, 30), now - 20))
    await post(api, ex("a", "a1", words("heapq"), words("argparse", 50, 120), now - 10))  # b's prompt leaked
    await post(api, ex("b", "b2", words("csv", 0, 40), "As you wrote: " + words("argparse", 60, 110), now))
    assert [(f["recipient_request_id"], f["source_tenant"]) for f in await findings(api)] == [("a1", "b")]


# Two real Debian changelog lines of one template (x11proto-core's and libxmu's): phrases of
# 7 and 5 tokens in common, in the same order, a package name and a version apart.
STITCH_PROMPT = "x11proto-core: drop pre-dependency on x11-common from libxt-dev, bump standards version to 3.7.3"
STITCH_ANSWER = "libxmu: drop pre-dependency on x11-common from libxmu-dev, bump standards version to 3.8.0"


@pytest.mark.parametrize("w", [5, 1])
async def test_short_phrases_of_one_genre_in_the_same_order_are_no_copy(api: Api, w: int) -> None:
    now = time.time()

    def exchange(tenant: str, prompt: str, response: str) -> dict[str, Any]:
        return fingerprint_exchange(
            prompt, response, key=KEY, tenant=tenant, request_id=f"{tenant}1", model="m", ts=now, params=Params(w=w)
        )

    a = exchange("a", words("argparse", 0, 40) + " " + STITCH_PROMPT, "ok")
    b = exchange("b", words("csv"), words("json", 0, 30) + " " + STITCH_ANSWER)
    c = exchange("c", words("heapq"), words("json", 0, 30) + " " + STITCH_PROMPT)
    for e in (a, b, c):
        await post(api, e)
    assert [f["recipient_tenant"] for f in await findings(api)] == ["c"]  # the line itself is a copy


# Two classes of one file (packaging's LegacyVersion and Version): one template filled in twice.
TEMPLATE_PROMPT = """
    @property
    def is_prerelease(self) -> bool:
        return False

    @property
    def is_postrelease(self) -> bool:
        return False

    @property
    def is_devrelease(self) -> bool:
        return False
"""
TEMPLATE_ANSWER = """
    @property
    def is_prerelease(self) -> bool:
        return self.dev is not None or self.pre is not None

    @property
    def is_postrelease(self) -> bool:
        return self.post is not None

    @property
    def is_devrelease(self) -> bool:
        return self.dev is not None
"""


@pytest.mark.parametrize("w", [3, 1])
async def test_a_template_filled_in_twice_is_no_copy(api: Api, w: int) -> None:
    """The same 7 tokens three times in the source's order, with other words between: the shape of
    an interleaved leak, but no 8 tokens in a row, which a copy needs at least once."""
    now = time.time()

    def exchange(tenant: str, prompt: str, response: str) -> dict[str, Any]:
        return fingerprint_exchange(
            prompt, response, key=KEY, tenant=tenant, request_id=f"{tenant}1", model="m", ts=now, params=Params(w=w)
        )

    await post(api, exchange("a", words("argparse", 0, 40) + TEMPLATE_PROMPT, "ok"))
    await post(api, exchange("b", words("csv"), words("json", 0, 30) + TEMPLATE_ANSWER))
    await post(api, exchange("c", words("heapq"), words("json", 0, 30) + TEMPLATE_PROMPT))
    assert [f["recipient_tenant"] for f in await findings(api)] == ["c"]  # the methods themselves are a copy


async def test_a_phrase_a_third_tenant_sent_takes_no_copy_from_an_answer(api: Api) -> None:
    # c's prompt shares 7 words with a's answer by chance: too short to be c's text where b was
    # served the answer, so the copy is still a's (a stretch of 8 tokens would be: STRETCH_TOKENS).
    now = time.time()
    answer = ANSWER.split()
    await post(api, ex("a", "a1", words("heapq"), ANSWER, now - 20))
    await post(
        api,
        ex("c", "c1", words("csv", 0, 30) + " " + " ".join(answer[20:27]) + " " + words("csv", 40, 60), "ok", now - 10),
    )
    await post(api, ex("b", "b1", words("difflib", 0, 40), words("json", 0, 30) + " " + " ".join(answer[16:30]), now))
    assert [(f["recipient_tenant"], f["source_tenant"]) for f in await findings(api)] == [("b", "a")]


async def test_a_phrase_the_model_said_to_others_too_does_not_cut_a_copy_of_an_answer(api: Api) -> None:
    # Five words of a's answer were also said to d and e: the model's own phrase, nobody's
    # evidence, but still a's text where b was served a's answer around it, so no hole there.
    now = time.time()
    answer = ANSWER.split()
    phrase = " ".join(answer[21:26])
    await post(api, ex("a", "a1", words("heapq"), ANSWER, now - 30))
    await post(api, ex("d", "d1", words("subprocess", 0, 30), words("difflib", 0, 20) + " " + phrase, now - 20))
    await post(api, ex("e", "e1", words("sqlite3", 0, 30), phrase + " " + words("difflib", 40, 60), now - 20))
    await post(api, ex("b", "b1", words("argparse", 0, 40), words("json", 0, 30) + " " + " ".join(answer[16:30]), now))
    assert [(f["recipient_tenant"], f["source_tenant"]) for f in await findings(api)] == [("b", "a")]
