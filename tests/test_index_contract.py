"""The index contract (service/index/base.py), held against every backend alike."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from bleedwatch.fingerprint.scheme import Params
from service.config import Settings
from service.index.base import SERVED_FIRST_BIT, Doc, DocMeta, Entry, Index, Kind, Lookup, sends
from service.index.window import Window
from tests.conftest import ALL_BACKENDS
from tests.traffic import fp, words

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("settings", ALL_BACKENDS, indirect=True)]

NS = "00112233445566aa"
NOW = time.time()


def doc(ref: int, tenant: int, kind: Kind, text: str) -> Doc:
    f = fp(text)
    return Doc(ref, tenant, kind, f.values, f.offsets)


async def test_tenant_refs_are_stable_and_distinct(index: Index) -> None:
    first = await index.tenant_refs(["acme", "globex"])
    again = await index.tenant_refs(["globex", "acme", "initech"])
    assert first["acme"] == again["acme"]
    assert first["globex"] == again["globex"]
    assert len({again["acme"], again["globex"], again["initech"]}) == 3


async def test_new_tenants_are_counted_per_key_and_minute(index: Index) -> None:
    """Known names pass, a new name counts once, and each key and each minute has its own budget."""
    await index.tenant_refs(["known"])
    minute = 60 * (int(NOW) // 60)
    assert await index.admit_new_tenants("a" * 16, ["n1", "known", "n1", "n2"], 2, minute) == set()
    assert await index.admit_new_tenants("a" * 16, ["n3", "n2", "known", "n4"], 2, minute + 59) == {"n3", "n4"}
    assert await index.admit_new_tenants("b" * 16, ["n3"], 2, minute) == set()
    assert await index.admit_new_tenants("a" * 16, ["n3", "n4", "n5"], 2, minute + 60) == {"n5"}


async def test_doc_refs_never_overlap(index: Index) -> None:
    a = await index.new_doc_refs(10)
    b = await index.new_doc_refs(5)
    assert set(range(a, a + 10)).isdisjoint(range(b, b + 5))


async def test_response_sharing_another_tenants_prompt_is_a_hit(index: Index) -> None:
    source = doc(1, 1, Kind.PROMPT, words("argparse"))
    assert await index.insert(NS, [source], NOW) == []
    leaked = doc(2, 2, Kind.RESPONSE, words("csv", 0, 50) + " " + words("argparse", 60, 100))
    hits = await index.insert(NS, [leaked], NOW)
    assert len(hits) == 1
    hit = hits[0]
    assert (hit.batch_pos, hit.tenant, hit.doc, hit.kinds) == (0, 1, 1, Kind.PROMPT)
    assert hit.count >= 5
    assert hit.count == len(set(leaked.values.tolist()) & set(source.values.tolist()))


async def test_source_arriving_after_the_leak_is_a_hit(index: Index) -> None:
    leaked = doc(2, 2, Kind.RESPONSE, words("csv", 0, 50) + " " + words("argparse", 60, 100))
    assert await index.insert(NS, [leaked], NOW) == []
    hits = await index.insert(NS, [doc(3, 1, Kind.PROMPT, words("argparse"))], NOW)
    assert [(h.batch_pos, h.tenant, h.doc, h.kinds) for h in hits] == [(0, 2, 2, Kind.RESPONSE)]


async def test_both_sides_in_one_batch_is_a_hit(index: Index) -> None:
    hits = await index.insert(
        NS,
        [doc(1, 1, Kind.PROMPT, words("argparse")), doc(2, 2, Kind.RESPONSE, words("argparse", 10, 60))],
        NOW,
    )
    assert [(h.batch_pos, h.tenant) for h in hits] == [(1, 1)]


async def test_same_tenant_and_own_prompt_are_not_hits(index: Index) -> None:
    await index.insert(NS, [doc(1, 1, Kind.PROMPT, words("json"))], NOW)
    assert await index.insert(NS, [doc(2, 1, Kind.RESPONSE, words("json", 5, 80))], NOW) == []
    # Tenant 2 echoing its own earlier prompt, which tenant 1 also sent: still not a leak to 2.
    await index.insert(NS, [doc(3, 2, Kind.PROMPT, words("json"))], NOW)
    assert await index.insert(NS, [doc(4, 2, Kind.RESPONSE, words("json", 5, 80))], NOW) == []


async def test_prompts_alone_never_hit(index: Index) -> None:
    await index.insert(NS, [doc(1, 1, Kind.PROMPT, words("heapq"))], NOW)
    assert await index.insert(NS, [doc(2, 2, Kind.PROMPT, words("heapq"))], NOW) == []


async def test_answers_hit_answers_and_a_prompt_hits_an_answer_once(index: Index) -> None:
    await index.insert(NS, [doc(1, 1, Kind.RESPONSE, words("heapq"))], NOW)
    hits = await index.insert(NS, [doc(2, 2, Kind.RESPONSE, words("heapq", 10, 60))], NOW)
    assert [(h.batch_pos, h.tenant, h.doc, h.kinds) for h in hits] == [(0, 1, 1, Kind.RESPONSE)]
    # A prompt with the text makes both answers worth judging again; sent again, it adds nothing.
    hits = await index.insert(NS, [doc(3, 3, Kind.PROMPT, words("heapq"))], NOW)
    assert sorted((h.tenant, h.doc) for h in hits) == [(1, 1), (2, 2)]
    assert await index.insert(NS, [doc(4, 3, Kind.PROMPT, words("heapq"))], NOW) == []


async def test_text_of_many_tenants_becomes_common(index: Index) -> None:
    text = words("unittest", 0, 120)
    for tenant in (1, 2):
        await index.insert(NS, [doc(tenant, tenant, Kind.PROMPT, text)], NOW)
    before = await index.lookup(NS, fp(text).values, NOW)
    assert all(x.entries is not None and {e.tenant for e in x.entries} == {1, 2} for x in before)
    await index.insert(NS, [doc(3, 3, Kind.PROMPT, text)], NOW)  # the third of common_tenants=3
    after = await index.lookup(NS, fp(text).values, NOW)
    assert all(x.entries is None for x in after)
    assert await index.insert(NS, [doc(4, 4, Kind.RESPONSE, text)], NOW) == []


@pytest.mark.parametrize("order", ["accepted", "reversed"])
async def test_lookup_names_each_tenants_first_document_and_whether_it_sent_the_text_first(
    index: Index, order: str
) -> None:
    """Tenant 1 was served the text, then its chat sent it back twice: no sender. Tenant 2 sent it,
    then was served it: a sender. The lowest refs decide, whatever order they are processed in."""
    text = words("subprocess", 0, 60)
    offsets = fp(text).offsets.tolist()
    docs = [(1, 1, Kind.RESPONSE), (2, 1, Kind.PROMPT), (3, 1, Kind.PROMPT), (4, 1, Kind.RESPONSE)]
    docs += [(5, 2, Kind.PROMPT), (6, 2, Kind.RESPONSE)]
    for i, (ref, tenant, kind) in enumerate(docs if order == "accepted" else docs[::-1]):
        await index.insert(NS, [doc(ref, tenant, kind, text)], NOW + i)
    for x, offset in zip(await index.lookup(NS, fp(text).values, NOW + 9), offsets, strict=True):
        assert x.entries is not None
        assert sorted((e.tenant, e.doc, e.offset, e.kinds) for e in x.entries) == [
            (1, 1, offset, Kind.PROMPT | Kind.RESPONSE | SERVED_FIRST_BIT),
            (2, 5, offset, Kind.PROMPT | Kind.RESPONSE),
        ]
        assert [sends(e.kinds) for e in sorted(x.entries)] == [False, True]
    unknown = await index.lookup(NS, np.array([1, 2**63, 2**64 - 1], dtype=np.uint64), NOW)
    assert [x.entries for x in unknown] == [(), (), ()]


async def test_text_in_many_answers_is_common_but_a_leak_to_a_few_is_not(index: Index) -> None:
    source = words("argparse")
    await index.insert(NS, [doc(1, 1, Kind.PROMPT, source)], NOW)
    for tenant in range(2, 8):  # the same content leaking to six other tenants: still evidence
        hits = await index.insert(NS, [doc(tenant, tenant, Kind.RESPONSE, source)], NOW)
        # ... and every earlier answer with it may be the source of this one, or the other way round
        assert sorted((h.tenant, h.doc) for h in hits) == [(t, t) for t in range(1, tenant)]
    await index.insert(NS, [doc(8, 8, Kind.RESPONSE, source)], NOW)  # eighth tenant: common_tenants=8
    assert all(x.entries is None for x in await index.lookup(NS, fp(source).values, NOW))


def senders_of(found: list[Lookup]) -> set[tuple[int, int, int, int]]:
    """The (tenant, doc, offset, kinds) kept for a text's fingerprints, all of them common."""
    assert all(x.entries is None for x in found)
    return {(e.tenant, e.doc, e.offset, e.kinds) for x in found for e in x.senders or ()}


async def test_a_leak_is_a_hit_when_its_recipients_next_turn_was_processed_first(index: Index) -> None:
    """Tenant 2's next turn sends the leaked answer back; accepted after the answer (a higher ref), it is
    processed first (another worker, a reclaimed batch). It is no prompt of tenant 2's before the answer."""
    secret = words("argparse", 0, 60)
    await index.insert(NS, [doc(5, 1, Kind.PROMPT, secret)], NOW)
    await index.insert(NS, [doc(20, 2, Kind.PROMPT, secret)], NOW)
    hits = await index.insert(NS, [doc(11, 2, Kind.RESPONSE, secret)], NOW)
    assert {(h.tenant, h.doc, h.kinds) for h in hits} == {(1, 5, Kind.PROMPT)}
    # Its own exchange's prompt (the ref before its response) is self-echo: no hit.
    await index.insert(NS, [doc(30, 3, Kind.PROMPT, secret)], NOW)
    assert await index.insert(NS, [doc(31, 3, Kind.RESPONSE, secret)], NOW) == []


async def test_a_prompt_leaked_into_many_answers_keeps_its_sender(index: Index) -> None:
    """The answers make it common (common_tenants=8), but its one sender is still known: a later
    judgment must not take the leak, which made it common, for public text."""
    source = words("argparse", 0, 80)
    f = fp(source)
    await index.insert(NS, [doc(5, 1, Kind.PROMPT, source)], NOW)
    for tenant in range(2, 10):
        await index.insert(NS, [doc(10 + tenant, tenant, Kind.RESPONSE, source)], NOW)
    found = await index.lookup(NS, f.values, NOW)
    assert all(x.entries is None for x in found)
    for x, offset in zip(found, f.offsets.tolist(), strict=True):
        assert x.senders == (Entry(1, 5, offset, Kind.PROMPT),)
    # A common value makes no hits, its sender's answers included.
    assert await index.insert(NS, [doc(30, 1, Kind.RESPONSE, source), doc(31, 12, Kind.RESPONSE, source)], NOW) == []
    both = Kind.PROMPT | Kind.RESPONSE
    assert senders_of(await index.lookup(NS, f.values, NOW)) == {(1, 5, o, both) for o in f.offsets.tolist()}
    # Every recipient's chat sends the leaked answer back in its next turn: none of them is a sender,
    # so it is not common by senders, and its one sender is still known.
    for tenant in range(2, 10):
        await index.insert(NS, [doc(40 + tenant, tenant, Kind.PROMPT, source)], NOW)
    assert senders_of(await index.lookup(NS, f.values, NOW)) == {(1, 5, o, both) for o in f.offsets.tolist()}


async def test_senders_are_kept_until_they_make_it_common(index: Index) -> None:
    source = words("csv", 0, 80)
    f = fp(source)
    await index.insert(NS, [doc(10, 1, Kind.PROMPT, source), doc(20, 2, Kind.PROMPT, source)], NOW)
    for tenant in range(3, 9):  # the eighth tenant to hold it
        await index.insert(NS, [doc(tenant, tenant, Kind.RESPONSE, source)], NOW)
    kept = senders_of(await index.lookup(NS, f.values, NOW))
    assert {(t, d, k) for t, d, _, k in kept} == {(1, 10, Kind.PROMPT), (2, 20, Kind.PROMPT)}
    # A kept sender's earlier prompt, processed late, becomes its entry; a later one changes nothing.
    await index.insert(NS, [doc(15, 2, Kind.PROMPT, source), doc(25, 1, Kind.PROMPT, source)], NOW)
    kept = senders_of(await index.lookup(NS, f.values, NOW))
    assert {(t, d, k) for t, d, _, k in kept} == {(1, 10, Kind.PROMPT), (2, 15, Kind.PROMPT)}
    await index.insert(NS, [doc(40, 9, Kind.PROMPT, source)], NOW)  # the third sender: common_prompt_tenants=3
    assert all(x.entries is None and x.senders is None for x in await index.lookup(NS, f.values, NOW))


async def test_a_sender_after_it_became_common_is_kept(index: Index) -> None:
    source = words("heapq", 0, 80)
    f = fp(source)
    for tenant in range(1, 9):
        await index.insert(NS, [doc(tenant, tenant, Kind.RESPONSE, source)], NOW)
    assert senders_of(await index.lookup(NS, f.values, NOW)) == set()  # common, no sender
    await index.insert(NS, [doc(20, 3, Kind.PROMPT, source)], NOW)  # tenant 3 sends back what it was told
    assert senders_of(await index.lookup(NS, f.values, NOW)) == set()
    await index.insert(NS, [doc(21, 30, Kind.PROMPT, source)], NOW)
    kept = senders_of(await index.lookup(NS, f.values, NOW))
    assert {(t, d, k) for t, d, _, k in kept} == {(30, 21, Kind.PROMPT)}


async def test_a_value_common_by_holders_remembers_a_bounded_number_of_them(index: Index) -> None:
    """Past what fits in ``HELD_VALUE_BYTES``, a new holder is not kept, and its resend then counts as a
    send. Tenants 1 to 15 take a byte each, from 16 on two."""
    source = words("csv", 0, 80)
    f = fp(source)
    for tenant in range(1, 61):
        await index.insert(NS, [doc(tenant, tenant, Kind.RESPONSE, source)], NOW)
    await index.insert(NS, [doc(100, 1, Kind.PROMPT, source), doc(101, 40, Kind.PROMPT, source)], NOW)
    kept = senders_of(await index.lookup(NS, f.values, NOW))
    assert {(t, d, k) for t, d, _, k in kept} == {(40, 101, Kind.PROMPT)}


async def test_text_in_many_answers_and_no_prompt_has_no_senders(index: Index) -> None:
    source = words("json", 0, 80)
    for tenant in range(1, 9):
        await index.insert(NS, [doc(tenant, tenant, Kind.RESPONSE, source)], NOW)
    found = await index.lookup(NS, fp(source).values, NOW)
    assert all(x.entries is None and x.senders == () for x in found)


async def test_senders_are_merged_over_the_window(index: Index, settings: Settings) -> None:
    """A sender's prompt in an older generation is found beside a newer one where it became common,
    counts with the senders kept there, and leaves with its own generation."""
    window = Window(settings.retention_seconds, settings.index_generations)
    start = window.current(NOW) * window.generation_seconds + 1
    source = words("socket", 0, 80)
    f = fp(source)
    await index.insert(NS, [doc(7, 1, Kind.PROMPT, source)], start)
    later = start + window.generation_seconds
    for tenant in range(2, 10):
        await index.insert(NS, [doc(10 + tenant, tenant, Kind.RESPONSE, source)], later)
    kept = senders_of(await index.lookup(NS, f.values, later))
    assert {(t, d, k) for t, d, _, k in kept} == {(1, 7, Kind.PROMPT)}
    # Once the sender's generation has left the window, the value stays common, with no sender.
    gone = start + (window.generations + 0.5) * window.generation_seconds
    assert window.current(gone) - window.current(start) == window.generations
    assert senders_of(await index.lookup(NS, f.values, gone)) == set()
    # Senders add up over generations: two kept in the older one, a third in a newer one.
    other = words("http", 0, 80)
    g = fp(other)
    await index.insert(NS, [doc(50, 1, Kind.PROMPT, other), doc(51, 2, Kind.PROMPT, other)], start)
    for tenant in range(3, 9):
        await index.insert(NS, [doc(50 + tenant, tenant, Kind.RESPONSE, other)], start)
    assert {t for t, *_ in senders_of(await index.lookup(NS, g.values, later))} == {1, 2}
    await index.insert(NS, [doc(60, 9, Kind.PROMPT, other)], later)
    assert all(x.entries is None and x.senders is None for x in await index.lookup(NS, g.values, later))


async def test_namespaces_are_separate(index: Index) -> None:
    await index.insert(NS, [doc(1, 1, Kind.PROMPT, words("socket"))], NOW)
    assert await index.insert("ffeeddccbbaa9988", [doc(2, 2, Kind.RESPONSE, words("socket"))], NOW) == []


async def test_entries_expire_with_the_window(index: Index, settings: Settings) -> None:
    await index.insert(NS, [doc(1, 1, Kind.PROMPT, words("difflib"))], NOW)
    retention = settings.retention_seconds
    soon = await index.lookup(NS, fp(words("difflib")).values, NOW + retention * 0.9)
    assert all(x.entries for x in soon)
    later = NOW + retention * 2
    assert all(x.entries == () for x in await index.lookup(NS, fp(words("difflib")).values, later))
    assert await index.insert(NS, [doc(2, 2, Kind.RESPONSE, words("difflib"))], later) == []


async def test_a_document_is_never_replaced_by_another_exchanges(index: Index) -> None:
    """A ref handed out twice (Redis lost its counter's last writes) leaves the first document and says so."""
    first = DocMeta("acme", "r-1", Kind.PROMPT, "m", NOW, 3, {}, Params())
    assert await index.put_docs(NS, {20: first}, NOW) == set()
    assert await index.put_docs(NS, {20: first}, NOW) == set()  # the same exchange processed again
    other = DocMeta("zeta", "r-9", Kind.PROMPT, "m", NOW, 4, {}, Params())
    answer = DocMeta("zeta", "r-9", Kind.RESPONSE, "m", NOW, 5, {}, Params())
    assert await index.put_docs(NS, {20: other, 21: answer}, NOW) == {20}
    got = await index.get_docs(NS, [20, 21], NOW)
    assert (got[20].tenant, got[20].request_id) == ("acme", "r-1")
    assert (got[21].tenant, got[21].kind) == ("zeta", Kind.RESPONSE)


async def test_docs_round_trip_and_expire(index: Index, settings: Settings) -> None:
    f = fp(words("sqlite3"))
    params = Params(n=5, w=7, sample_after=100, sample_mod=3)
    context: dict[str, str | int | float | bool | None] = {"node": "n1", "prompt_tokens": 7}
    meta = DocMeta("acme", "r-1", Kind.RESPONSE, "m", NOW, f.token_count, context, params, f.values, f.offsets)
    prompt = DocMeta("acme", "r-1", Kind.PROMPT, "m", NOW, 12, {}, Params())
    await index.put_docs(NS, {10: meta, 11: prompt}, NOW)
    got = await index.get_docs(NS, [10, 11, 12], NOW)
    assert set(got) == {10, 11}
    assert got[10].request_id == "r-1"
    assert got[10].context == context
    assert got[10].params == params
    assert got[10].values is not None
    assert got[10].offsets is not None
    assert np.array_equal(got[10].values, f.values)
    assert np.array_equal(got[10].offsets, f.offsets)
    assert got[11].values is None
    retention = settings.retention_seconds
    assert await index.get_docs(NS, [10], NOW + retention * 2) == {}


async def test_done_marks_are_per_key_and_expire(index: Index, settings: Settings) -> None:
    assert await index.done(["a", "b"], NOW) == [False, False]
    await index.mark_done(["a"], NOW)
    assert await index.done(["a", "b"], NOW) == [True, False]
    retention = settings.retention_seconds
    assert await index.done(["a"], NOW + retention * 2) == [False]


async def test_entries_keep_wide_refs_and_offsets(index: Index) -> None:
    """Entries are packed (varint tenant and offset, u32 doc): the extremes come back intact."""
    values = np.array([0x0102030405060708, 0xFFFFFFFFFFFFFFFF, 0, 0x00FF00FF00FF00FF], dtype=np.uint64)
    offsets = np.array([0, 127, 16_384, 2**32 - 1], dtype=np.uint32)
    big_tenant, big_doc = 2**32 - 1, 2**32 - 1
    await index.insert(NS, [Doc(big_doc, big_tenant, Kind.PROMPT, values, offsets)], NOW)
    await index.insert(NS, [Doc(7, 300, Kind.RESPONSE, values[:2], offsets[:2])], NOW)
    found = await index.lookup(NS, values, NOW)
    for x, offset in zip(found, offsets.tolist(), strict=True):
        assert x.entries is not None
        assert (x.entries[0].tenant, x.entries[0].doc, x.entries[0].offset) == (big_tenant, big_doc, offset)
    assert found[0].entries is not None
    assert [(e.tenant, e.doc, e.kinds) for e in found[0].entries] == [
        (big_tenant, big_doc, Kind.PROMPT),
        (300, 7, Kind.RESPONSE),
    ]
    with pytest.raises(ValueError, match="u32"):
        await index.insert(NS, [Doc(2**32, 1, Kind.PROMPT, values, offsets)], NOW)


async def test_doc_refs_stay_below_two_to_the_32(index: Index) -> None:
    first = await index.new_doc_refs(3)
    assert 0 < first < first + 3 <= 2**32
    with pytest.raises(ValueError, match="count"):
        await index.new_doc_refs(0)


async def test_a_large_insert_and_lookup_leave_the_event_loop_to_others(index: Index) -> None:
    """A batch near the size limits must not hold the loop (health checks, other requests) for its whole
    insert: Redis' calls wait on the network, the embedded index yields every few thousand fingerprints."""
    ticks = 0
    running = True

    async def tick() -> None:
        nonlocal ticks
        while running:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    values = np.arange(1, 40_001, dtype=np.uint64) * np.uint64(2_654_435_761)
    docs = [Doc(900, 9, Kind.PROMPT, values, np.arange(len(values), dtype=np.uint32))]  # one text may hold 500,000
    await asyncio.sleep(0)
    before = ticks
    await index.insert(NS, docs, NOW)
    during_insert, before = ticks - before, ticks
    await index.lookup(NS, values, NOW)
    during_lookup = ticks - before
    running = False
    await ticker
    assert during_insert >= 2
    assert during_lookup >= 2
