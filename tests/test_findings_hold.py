"""BLEEDWATCH_FINDINGS_HOLD_SECONDS, end to end on every backend: a finding waits, is judged again,
and is raised only if it still is one. Public text more tenants send meanwhile is withdrawn; what
a leak itself causes later (the chat sending the leaked answer back, the same prompt leaked into
many answers) is not. The hold's end is brought forward by moving the findings on hold as if its
time had come; the app's own findings writer then judges and writes them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from bleedwatch.fingerprint.encoding import U32_LE, U64_LE, encode
from service.auth.keys import Role
from service.config import Settings
from service.findings.severity import Severity
from service.findings.writer import CLAIM_COUNT
from service.index.base import Index
from service.tools.probe import UNSAMPLED, canary_text
from tests.conftest import ALL_BACKENDS, Api, running_api
from tests.test_detection_rules import LICENSE, NS, admin, findings, post
from tests.traffic import exchange as ex
from tests.traffic import fp, words

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
    """The incident: one tenant's prompt in the answers of many. Held by nine tenants the text is common,
    so the ones found before it was stay found; only senders make text public."""
    now = time.time()
    await post(held, ex("t0", "r0", SECRET, words("json", 0, 30), now))
    for i in range(1, 9):
        await post(held, ex(f"v{i}", f"v{i}", words("heapq", 0, 20 + i), "Here: " + SECRET, now + i))
    found = await on_hold(held)
    assert found >= 5
    before = withdrawn()
    await hold_over(held)
    assert len(await pairs(held)) == found
    assert {s for _, s in await pairs(held)} == {"t0"}
    assert withdrawn() == before


async def test_a_canary_is_raised_at_once(held: Api) -> None:
    now = time.time()
    canary = canary_text(300)
    cfp = fp(canary, UNSAMPLED)
    text = {
        "fingerprints": encode(cfp.values, U64_LE),
        "offsets": encode(cfp.offsets, U32_LE),
        "token_count": cfp.token_count,
    }
    await admin(held, "POST", "/v1/canaries", json={"key_id": NS, "tenant": "canary", "label": "p1", "text": text})
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
