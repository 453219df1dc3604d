"""BLEEDWATCH_FINDINGS_HOLD_SECONDS, end to end on every backend: a finding waits, is judged again,
and is raised only if it still is one. Public text more tenants send meanwhile is withdrawn; what
a leak itself causes later (the chat sending the leaked answer back, the same prompt leaked into
many answers) is not. The hold's end is brought forward by moving the findings on hold as if its
time had come; the app's own findings writer then judges and writes them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import numpy as np
import orjson
import pytest
from prometheus_client import REGISTRY

from service.auth.keys import Role
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.findings import store as findings_store
from service.findings.draft import FindingDraft
from service.findings.severity import Severity
from service.findings.writer import CLAIM_COUNT, FindingsWriter, Written
from service.index.base import Index
from service.ingest.service import Ingestor
from service.matching.known import NO_CANARIES, Known, KnownFingerprints
from service.matching.matcher import Matcher
from service.matching.thresholds import thresholds
from service.migrate import upgrade
from service.pipeline import limits
from service.tools.probe import canary_text
from tests.conftest import ALL_BACKENDS, Api, running_api
from tests.test_detection_rules import LICENSE, findings, post, register_canary
from tests.test_findings_outbox import _draft
from tests.traffic import exchange as ex
from tests.traffic import words

pytestmark = pytest.mark.anyio

HOLD = 600.0
SECRET = words("argparse", 0, 60)


@pytest.fixture
async def held(settings: Settings) -> AsyncIterator[Api]:
    async with running_api(settings.model_copy(update={"findings_hold_seconds": HOLD})) as api:
        yield api


def _index(api: Api) -> Index:
    index: Index = api.app.state.deps.index
    return index


async def on_hold(api: Api) -> int:
    return await _index(api).outbox().later_size()


async def hold_over(api: Api, timeout_seconds: float = 60.0) -> None:
    """As if the hold had passed: everything on hold is due now; wait until the writer has judged it all."""
    outbox = _index(api).outbox()
    while await outbox.move_due(time.time() + HOLD + 1, CLAIM_COUNT):
        pass
    deadline = time.monotonic() + timeout_seconds
    while await outbox.size():
        assert time.monotonic() < deadline, "findings still waiting in the outbox"
        await asyncio.sleep(0.05)


def withdrawn() -> float:
    return sum(REGISTRY.get_sample_value("bleedwatch_findings_withdrawn_total", {"severity": s}) or 0 for s in Severity)


async def pairs(api: Api) -> list[tuple[str, str]]:
    return sorted((f["recipient_tenant"], f["source_tenant"]) for f in await findings(api))


async def test_a_leak_is_raised_once_the_hold_is_over(held: Api) -> None:
    now = time.time()
    await post(held, ex("t0", "r0", SECRET, words("json", 0, 30), now))
    result: dict[str, Any] = await post(held, ex("t9", "r9", words("heapq"), "Here: " + SECRET, now))
    assert result["findings"] == 0  # on hold: none raised yet
    assert await findings(held) == []
    assert await on_hold(held) == 1
    await hold_over(held)
    assert await pairs(held) == [("t9", "t0")]
    assert await on_hold(held) == 0


async def test_public_text_more_tenants_sent_during_the_hold_is_withdrawn(held: Api) -> None:
    now = time.time()
    await post(held, ex("t0", "r0", LICENSE, words("json", 0, 30), now))
    await post(held, ex("t9", "r9", words("heapq"), "Quoting: " + LICENSE, now))
    assert await on_hold(held) == 1
    before = withdrawn()
    for i in (1, 2):  # three tenants have now sent it: public text, not t0's
        await post(held, ex(f"t{i}", f"r{i}", "See: " + LICENSE, words("csv", 40 * i, 40 * i + 30), now))
    await hold_over(held)
    assert await findings(held) == []
    assert withdrawn() == before + 1


async def test_the_chat_sending_the_leaked_answer_back_does_not_withdraw_it(held: Api) -> None:
    now = time.time()
    await post(held, ex("t0", "r0", SECRET, words("json", 0, 30), now))
    leaked = "Here: " + SECRET
    await post(held, ex("t9", "r9", words("heapq"), leaked, now))
    # The recipient's next turn carries the whole conversation, the leaked answer included.
    turn = words("heapq") + " " + leaked + " what is this?"
    await post(held, ex("t9", "r9-next", turn, words("csv", 0, 30), now + 5))
    await hold_over(held)
    assert await pairs(held) == [("t9", "t0")]


async def test_one_prompt_leaked_into_many_answers_stays_leaked_after_the_hold(held: Api) -> None:
    """The incident: one tenant's prompt in the answers of many, which their chats send back. Held by
    nine tenants the text is common, so the ones found before it was stay found; only senders make
    text public, and a tenant that was served the text before it sent it is none."""
    now = time.time()
    await post(held, ex("t0", "r0", SECRET, words("json", 0, 30), now))
    for i in range(1, 9):
        await post(held, ex(f"v{i}", f"v{i}", words("heapq", 0, 20 + i), "Here: " + SECRET, now + i))
    for i in range(1, 9):  # and every recipient's chat sends it back
        turn = words("heapq", 0, 20 + i) + " Here: " + SECRET + " what is this?"
        await post(held, ex(f"v{i}", f"v{i}-next", turn, words("difflib", 30 * i, 30 * i + 30), now + 10 + i))
    found = await on_hold(held)
    assert found >= 5
    before = withdrawn()
    await hold_over(held)
    assert len(await pairs(held)) == found
    assert {s for _, s in await pairs(held)} == {"t0"}
    assert withdrawn() == before


async def test_another_recipient_resending_the_leak_does_not_make_it_public(held: Api) -> None:
    """Two answers carried t0's prompt; the first recipient's chat goes on, sending it back. It was
    served that text: a recipient resending it, not a second tenant that had it."""
    now = time.time()
    await post(held, ex("t0", "r0", SECRET, words("json", 0, 30), now))
    await post(held, ex("v1", "v1", words("heapq", 0, 30), "Here: " + SECRET, now + 1))
    await post(held, ex("v2", "v2", words("csv", 0, 30), "Here: " + SECRET, now + 2))
    turn = words("heapq", 0, 30) + " Here: " + SECRET + " what is this?"
    await post(held, ex("v1", "v1-next", turn, words("difflib", 0, 30), now + 5))
    assert await on_hold(held) == 2
    await hold_over(held)
    assert await pairs(held) == [("v1", "t0"), ("v2", "t0")]


async def test_every_recipient_sending_the_leak_back_does_not_make_it_public(held: Api) -> None:
    """Three tenants were served t0's prompt and their chats each send it back within the hold: four
    tenants have sent it, but three were served it first, so it is not common by senders."""
    now = time.time()
    await post(held, ex("t0", "r0", SECRET, words("json", 0, 30), now))
    topics = ("heapq", "csv", "sqlite3")
    for i, topic in enumerate(topics, start=1):
        await post(held, ex(f"v{i}", f"v{i}", words(topic, 0, 30), "Here: " + SECRET, now + i))
    for i, topic in enumerate(topics, start=1):
        turn = words(topic, 0, 30) + " Here: " + SECRET + " what is this?"
        await post(held, ex(f"v{i}", f"v{i}-next", turn, words("difflib", 30 * i, 30 * i + 30), now + 5 + i))
    assert await on_hold(held) == 3
    await hold_over(held)
    assert await pairs(held) == [("v1", "t0"), ("v2", "t0"), ("v3", "t0")]


async def test_a_source_that_arrived_after_the_leak_is_no_resend(held: Api) -> None:
    """The source exchange was sent before the leaked answer and arrived after it (an arrival race), its
    own answer echoing its prompt: its tenant was served the text too, but sent it first."""
    now = time.time()
    await post(held, ex("v9", "v9", words("heapq", 0, 30), "Here: " + SECRET, now))
    await post(held, ex("t0", "r0", SECRET, "You wrote: " + SECRET, now - 5))
    assert await on_hold(held) >= 1
    await hold_over(held)
    assert ("v9", "t0") in await pairs(held)


async def test_a_finding_that_cannot_be_judged_again_is_raised(settings: Settings, index: Index) -> None:
    """A judgment that fails (Redis away, a bug) must not hold back the outbox: fail open."""
    if settings.database_url is None:
        upgrade(settings)
    engine = make_engine(settings)

    async def broken(draft: FindingDraft) -> bool:
        raise ConnectionError("index unreachable")

    writer = FindingsWriter(make_sessionmaker(engine), index.outbox(), hold_seconds=HOLD, judge=broken)
    draft = dataclasses.replace(_draft("r-held"), response_ref=11, recipient_ref=2)
    try:
        assert await writer.write([draft]) == []
        assert await index.outbox().later_size() == 1
        assert await index.outbox().move_due(time.time() + HOLD + 1, CLAIM_COUNT) == 1
        assert await writer.drain() == 1
        assert await index.outbox().size() == 0
        async with session_scope(make_sessionmaker(engine)) as session:
            rows, _ = await findings_store.page(session, findings_store.FindingFilter(), None, 10)
        assert [r.finding.recipient_request_id for r in rows] == ["r-held"]
    finally:
        await engine.dispose()


async def test_drafting_a_finding_on_hold_again_keeps_its_due_time(index: Index) -> None:
    box = index.outbox()
    now = time.time()
    await box.hold_until([b"draft"], now + 10)
    await box.hold_until([b"draft", b"draft"], now + 100)
    assert await box.later_size() == 1
    assert await box.move_due(now + 11, CLAIM_COUNT) == 1


async def test_a_finding_whose_source_left_the_window_is_kept(index: Index, settings: Settings) -> None:
    """What the finding was judged on is gone: no second judgment can say it was public."""
    matcher = Matcher(index, NoLists(), thresholds(settings), settings.max_request_seconds)
    writer = _Collect()
    ingestor = Ingestor(index, matcher, cast(Any, None), limits(settings), writer)
    now = time.time()
    for exchanges in (
        [ex("t0", "r0", LICENSE, words("json", 0, 30), now)],
        [ex("t9", "r9", words("heapq"), "Quoting: " + LICENSE, now + 1)],
        [ex(f"t{i}", f"r{i}", "See: " + LICENSE, words("csv", 40 * i, 40 * i + 30), now + 2) for i in (1, 2)],
    ):
        await ingestor.process(b"\n" + orjson.dumps({"exchanges": exchanges}))
    (draft,) = writer.drafts
    assert draft.response_ref is not None
    assert draft.recipient_ref is not None
    assert draft.source_ref is not None
    judge = functools.partial(matcher.confirm, draft.key_id, draft.response_ref, draft.recipient_ref, time.time())
    assert not await judge(draft.source_ref)  # public since: withdrawn
    assert await judge(draft.source_ref + 1_000_000)  # a source no longer in the window: kept


class NoLists(KnownFingerprints):
    def __init__(self) -> None:
        pass

    async def get(self, key_id: str) -> Known:
        return Known(np.empty(0, np.uint64), NO_CANARIES)


class _Collect(FindingsWriter):
    def __init__(self) -> None:
        self.drafts: list[FindingDraft] = []

    async def write(self, drafts: list[FindingDraft]) -> Written | None:
        self.drafts += drafts
        return None


async def test_a_canary_is_raised_at_once(held: Api) -> None:
    now = time.time()
    canary = canary_text(300)
    await register_canary(held, canary)
    leaked = " ".join(canary.split()[100:130])
    await post(held, ex("victim", "v1", words("heapq"), words("difflib", 0, 40) + " " + leaked, now))
    assert await pairs(held) == [("victim", "canary")]
    assert await on_hold(held) == 0


@pytest.mark.parametrize("settings", ALL_BACKENDS, indirect=True)
async def test_the_outbox_keeps_items_on_hold_until_due(index: Index) -> None:
    box = index.outbox()
    now = time.time()
    await box.hold_until([b"first", b"second"], now + 10)
    await box.hold_until([b"third"], now + 20)
    assert (await box.later_size(), await box.size()) == (3, 0)
    assert await box.move_due(now + 5, 10) == 0
    assert await box.move_due(now + 15, 1) == 1  # at most count
    assert await box.move_due(now + 15, 10) == 1
    assert (await box.later_size(), await box.size()) == (1, 2)
    assert sorted(item for _, item in await box.claim("replica-1", 10, 60)) == [b"first", b"second"]
    # A purge rewrites items on hold too.
    assert await box.rewrite(lambda item: None if item == b"third" else item) == 1
    assert await box.later_size() == 0
    assert await box.move_due(now + 30, 10) == 0


async def test_the_queue_status_counts_findings_on_hold(held: Api) -> None:
    now = time.time()
    await post(held, ex("t0", "r0", SECRET, words("json", 0, 30), now))
    await post(held, ex("t9", "r9", words("heapq"), "Here: " + SECRET, now))
    resp = await held.client.get("/v1/queue", headers=held.headers(Role.READ))
    assert resp.json()["findings_on_hold"] == 1
