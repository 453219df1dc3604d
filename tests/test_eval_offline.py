"""The evaluation's in-process replay and what it asks of the matcher after the traffic."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bench.eval import offline
from bench.eval.traffic import Exchange, Traffic, next_turns
from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS
from tests.traffic import KEY, words

pytestmark = pytest.mark.anyio

NOTICE = words("unittest", 80, 200).split()  # a public notice no allowlist knows
SECRET = words("argparse", 0, 60).split()


def _traffic(*exchanges: tuple[str, str, list[str], list[str]]) -> Traffic:
    order = [Exchange(t, r, p, a, ts=float(i)) for i, (t, r, p, a) in enumerate(exchanges)]
    return Traffic(order, [], len(order))


async def test_judging_again_at_the_end_drops_what_later_text_explains_and_keeps_a_leak() -> None:
    traffic = _traffic(
        ("t0", "t0-1", NOTICE + SECRET, words("json", 0, 30).split()),
        ("t9", "t9-1", words("heapq").split(), ["quoting", *NOTICE]),  # one tenant had sent it: a finding
        ("t8", "t8-1", words("heapq", 40).split(), ["leaked", *SECRET]),  # only t0 ever sent it
        ("t1", "t1-1", ["see", *NOTICE], words("csv", 0, 30).split()),  # two more send the notice:
        ("t2", "t2-1", ["also", *NOTICE], words("sqlite3", 0, 30).split()),  # common from here on
    )
    # One exchange a batch: t9 is judged before t1 and t2 send the notice.
    replayed = await offline.replay(traffic, KEY, DEFAULT_PARAMS, np.empty(0, np.uint64), batch=1)
    assert sorted((f["recipient_tenant"], f["source_tenant"]) for f in replayed.findings) == [
        ("t8", "t0"),
        ("t9", "t0"),
    ]
    assert await replayed.judge_again("t9-1") is None
    leak = await replayed.judge_again("t8-1")
    assert leak is not None
    assert leak.source_tenant == "t0"


async def test_why_marks_the_copy_and_what_no_other_tenant_holds() -> None:
    traffic = _traffic(
        ("t0", "t0-1", SECRET, words("json", 0, 30).split()),
        ("t8", "t8-1", words("heapq").split(), [*words("csv", 0, 12).split(), *SECRET]),
    )
    replayed = await offline.replay(traffic, KEY, DEFAULT_PARAMS, np.empty(0, np.uint64))
    got = (await replayed.why("t8-1"))["t0"]
    letters = got.split(": ")[-1]
    # The copy is counted; the recipient's own words before it are in the index only as its own answer.
    assert "#" in letters
    assert letters.startswith(".")
    assert "x" not in letters


def test_a_chat_goes_on_after_its_exchange_sending_it_back() -> None:
    """``next_turns``: a next turn sends the whole conversation back, after the exchange, in time too."""
    order = [Exchange(f"tenant-{i:03d}", f"r{i}", [f"q{i}"], [f"a{i}"], ts=float(i)) for i in range(50)]
    rng = random.Random(3)
    assert next_turns(order, 0.0, rng, lambda t: ["new"], lambda t: ["said"]) == order
    chats = next_turns(order, 1.0, rng, lambda t: ["new"], lambda t: ["said"])
    assert len(chats) == 100
    at = {ex.request_id: i for i, ex in enumerate(chats)}
    for ex in order:
        turn = chats[at[f"{ex.request_id}-next"]]
        assert at[turn.request_id] > at[ex.request_id]
        assert turn.ts > ex.ts
        assert (turn.tenant, turn.prompt, turn.response) == (ex.tenant, ex.prompt + ex.response + ["new"], ["said"])
