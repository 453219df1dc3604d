"""A chat's next turn sends the conversation back, a leaked answer included: on every backend, in
process, with the refs given at acceptance and the batches processed in the order each case needs
(a worker may take a later batch first). A tenant served a text before it sent it is no sender."""

from __future__ import annotations

import time
from typing import Any, cast

import orjson
import pytest

from service.config import Settings
from service.findings.draft import FindingDraft
from service.findings.writer import FindingsWriter, Written
from service.index.base import Index
from service.ingest.service import Ingestor
from service.matching.matcher import Matcher
from service.matching.thresholds import thresholds
from service.pipeline import limits
from tests.conftest import ALL_BACKENDS
from tests.test_findings_hold import NoLists
from tests.traffic import exchange as ex
from tests.traffic import words

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("settings", ALL_BACKENDS, indirect=True)]

SECRET = words("argparse", 0, 60)
ANSWER = words("subprocess", 0, 60)  # what the model said to t0


class _Collect(FindingsWriter):
    def __init__(self) -> None:
        self.drafts: dict[str, FindingDraft] = {}

    async def write(self, drafts: list[FindingDraft]) -> Written | None:
        self.drafts.update((d.recipient_request_id, d) for d in drafts)
        return None


class _Service:
    def __init__(self, index: Index, settings: Settings) -> None:
        self.matcher = Matcher(index, NoLists(), thresholds(settings), settings.max_request_seconds)
        self.writer = _Collect()
        self.ingestor = Ingestor(index, self.matcher, cast(Any, None), limits(settings), self.writer)

    async def process(self, *steps: tuple[int, dict[str, Any]]) -> None:
        """Each exchange in its own batch, accepted with that prompt ref, processed in the order given."""
        for ref, exchange in steps:
            await self.ingestor.process(b"\n@%d\n" % ref + orjson.dumps({"exchanges": [exchange]}))

    def found(self) -> list[tuple[str, str]]:
        return sorted((d.recipient_request_id, d.source_tenant) for d in self.writer.drafts.values())

    async def confirmed(self) -> list[tuple[str, bool]]:
        out = []
        for rid, d in sorted(self.writer.drafts.items()):
            assert d.response_ref is not None
            assert d.recipient_ref is not None
            ok = await self.matcher.confirm(d.key_id, d.response_ref, d.recipient_ref, time.time(), d.source_ref)
            out.append((rid, ok))
        return out


def leak(tenant: str, rid: str, text: str, ts: float) -> dict[str, Any]:
    return ex(tenant, rid, words("heapq", 0, 30), "Here: " + text, ts)


def next_turn(tenant: str, rid: str, text: str, ts: float) -> dict[str, Any]:
    return ex(tenant, rid, words("heapq", 0, 30) + " Here: " + text + " what is this?", words("difflib", 0, 30), ts)


async def test_a_source_accepted_after_the_leak_and_its_next_turn_is_found(index: Index, settings: Settings) -> None:
    service, now = _Service(index, settings), time.time()
    await service.process(
        (20, leak("v1", "v1", SECRET, now)),
        (30, next_turn("v1", "v1-next", SECRET, now + 5)),
        (40, ex("t0", "r0", SECRET, words("json", 0, 30), now - 5)),  # sent first, accepted last
    )
    assert service.found() == [("v1", "t0")]


async def test_a_next_turn_processed_before_the_leak_it_sends_back(index: Index, settings: Settings) -> None:
    service, now = _Service(index, settings), time.time()
    await service.process(
        (10, ex("t0", "r0", SECRET, words("json", 0, 30), now - 5)),
        (30, next_turn("v1", "v1-next", SECRET, now + 5)),
        (20, leak("v1", "v1", SECRET, now)),
    )
    assert service.found() == [("v1", "t0")]


async def test_another_leak_judged_while_a_next_turn_waits_for_its_answer(index: Index, settings: Settings) -> None:
    """v1's next turn counts as a send until v1's answer is indexed: v2's leak, judged then, is text two
    tenants sent; once v1's answer is in, v2's (a later answer) is judged again and found."""
    service, now = _Service(index, settings), time.time()
    await service.process(
        (10, ex("t0", "r0", SECRET, words("json", 0, 30), now - 5)),
        (30, next_turn("v1", "v1-next", SECRET, now + 5)),
        (40, leak("v2", "v2", SECRET, now + 8)),
        (20, leak("v1", "v1", SECRET, now)),
    )
    assert service.found() == [("v1", "t0"), ("v2", "t0")]


async def test_an_answer_its_own_tenant_sent_back_is_still_that_tenants_answer(
    index: Index, settings: Settings
) -> None:
    """t0's chat sends its answer back; a decode-side leak of that answer into v1 is t0's."""
    service, now = _Service(index, settings), time.time()
    await service.process(
        (10, ex("t0", "a1", words("json", 0, 30), ANSWER, now - 20)),
        (20, ex("t0", "a2", words("json", 0, 30) + " " + ANSWER + " and more?", words("csv", 40, 70), now - 10)),
        (30, leak("v1", "v4", ANSWER, now)),
    )
    assert service.found() == [("v4", "t0")]


async def test_the_hold_keeps_a_second_leak_its_recipient_sent_back(index: Index, settings: Settings) -> None:
    """v1 was leaked most of t0's text, then all of it, and its chat sends the second answer back. Judged
    again after the hold, that resend is not v1's own text: both stay findings."""
    service, now = _Service(index, settings), time.time()
    await service.process(
        (10, ex("t0", "r0", SECRET, words("json", 0, 30), now - 5)),
        (20, leak("v1", "v1a", words("argparse", 0, 55), now)),
        (30, ex("v1", "v1b", words("sqlite3", 0, 30), "Again: " + SECRET, now + 10)),
        (40, next_turn("v1", "v1b-next", "Again: " + SECRET, now + 20)),
    )
    assert service.found() == [("v1a", "t0"), ("v1b", "t0")]
    assert await service.confirmed() == [("v1a", True), ("v1b", True)]
