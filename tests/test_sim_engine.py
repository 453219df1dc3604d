"""The simulated paged-KV engine: pages reused without zeroing, the over-pool bug, the fix."""

from __future__ import annotations

from dataclasses import replace

import pytest

from service.tools.sim.corpus import TENANTS, prompt, tenant_words
from service.tools.sim.engine import Engine, EngineConfig, Mode, Pool, Refused, Served, Signal, answer
from service.tools.sim.traffic import plan

SMALL = EngineConfig(context_length=400, prefill_pool_tokens=200, decode_pool_tokens=400, page_size=16)
FIXED_SMALL = replace(SMALL, mode=Mode.FIXED)


def served(result: Served | Refused) -> Served:
    assert isinstance(result, Served), result
    return result


def test_tenants_texts_are_real_disjoint_and_long_enough() -> None:
    texts = {t: tenant_words(t) for t in TENANTS}
    assert all(len(words) >= 6_000 for words in texts.values())
    shingles = {t: {tuple(w[i : i + 12]) for i in range(len(w) - 12)} for t, w in texts.items()}
    for a in TENANTS:
        for b in TENANTS:
            if a < b:
                assert not shingles[a] & shingles[b], (a, b)
    assert prompt("acme", 10, len(texts["acme"]) - 5).split()[5:] == list(texts["acme"][:5])  # wraps around
    with pytest.raises(ValueError, match="fewer than"):
        prompt("acme", 10**6)


def test_pool_hands_released_pages_out_again_with_their_contents() -> None:
    pool = Pool("p", 64, 16)
    assert (pool.pages, pool.capacity) == (4, 64)
    first = pool.alloc(2)
    assert first == [0, 1]
    pool.write(first, [f"w{i}" for i in range(20)], owner=7)
    pool.release(first)
    again = pool.alloc(3)
    assert again == [0, 1, 2]
    slots = pool.read(again, 40)
    assert slots[:20] == [(f"w{i}", 7) for i in range(20)]  # not zeroed
    assert slots[20:] == [(None, -1)] * 20  # never written
    assert pool.alloc(2) is None  # one page left


def test_answers_quote_and_paraphrase_their_context() -> None:
    context: list[tuple[str | None, int]] = [(f"t{i}", 1) for i in range(200)]
    words, quoted = answer(context, SMALL)
    assert words[:20] == [f"t{i}" for i in range(0, 40, 2)]  # the paraphrase
    assert len(quoted) == 3
    assert all(len(q) == 48 for q in quoted)
    text = " ".join(words)
    assert " ".join(f"t{i}" for i in range(48)) in text
    assert " ".join(f"t{i}" for i in range(152, 200)) in text
    assert answer([(None, -1)] * 10, SMALL) == ([], [])


def test_normal_requests_are_answered_from_their_own_prompt() -> None:
    engine = Engine(SMALL)
    a = served(engine.serve("acme", prompt("acme", 150)))
    b = served(engine.serve("globex", prompt("globex", 120)))
    for result in (a, b):
        assert not result.stale
        assert result.leaked_from == ()
        assert [s.request_id for s in result.sources] == [result.request_id]
    assert a.prompt_tokens == 150
    assert " ".join(tenant_words("acme")[:48]) in a.answer
    assert engine.history.signals == []


def test_the_bug_an_over_pool_prompt_is_decoded_from_other_tenants_stale_pages() -> None:
    signals: list[Signal] = []
    engine = Engine(SMALL, on_signal=signals.append)
    source = served(engine.serve("acme", prompt("acme", 190)))
    leak = served(engine.serve("globex", prompt("globex", 300)))  # over the 200-token pool
    assert leak.stale
    assert leak.prompt_tokens == 300
    assert [(s.tenant, s.request_id) for s in leak.leaked_from] == [("acme", source.request_id)]
    assert leak.leaked_from[0].longest_run == 48
    assert " ".join(tenant_words("acme")[1:48]) in leak.answer  # acme's text, in globex's answer
    assert " ".join(tenant_words("globex")[:5]) not in leak.answer
    assert [(s.kind, s.node, s.request_id) for s in signals] == [("kv_transfer_short", "decode-0", leak.request_id)]
    assert engine.history.leaks() == [leak]
    # The pages stay stale: the next over-pool prompt reads acme's text again.
    again = served(engine.serve("initech", prompt("initech", 250)))
    assert [s.request_id for s in again.leaked_from] == [source.request_id]


def test_the_fix_refuses_an_over_pool_prompt() -> None:
    engine = Engine(FIXED_SMALL)
    served(engine.serve("acme", prompt("acme", 190)))
    refused = engine.serve("globex", prompt("globex", 300))
    assert isinstance(refused, Refused)
    assert (refused.status, refused.code) == (400, "context_length_exceeded")
    assert "prefill KV pool" in refused.message
    assert engine.history.signals == []
    assert engine.nodes[0].decode.free_pages == engine.nodes[0].decode.pages  # reserved pages given back


@pytest.mark.parametrize("mode", list(Mode))
def test_over_the_context_length_is_refused_in_both_modes(mode: Mode) -> None:
    config = FIXED_SMALL if mode is Mode.FIXED else SMALL
    refused = Engine(config).serve("acme", prompt("acme", 401))
    assert isinstance(refused, Refused)
    assert refused.status == 400
    assert "maximum context length is 400" in refused.message
    assert isinstance(Engine(config).serve("acme", ""), Refused)


def test_nodes_take_turns_and_keep_their_own_pages() -> None:
    engine = Engine(replace(SMALL, nodes=2))
    a = served(engine.serve("acme", prompt("acme", 190)))
    b = served(engine.serve("globex", prompt("globex", 190)))
    leak = served(engine.serve("initech", prompt("initech", 300)))  # decode-0 again: acme's pages
    assert (a.node, b.node, leak.node) == ("decode-0", "decode-1", "decode-0")
    assert {s.tenant for s in leak.leaked_from} == {"acme"}


def test_the_reported_config_says_what_each_build_declares() -> None:
    buggy, fixed = EngineConfig().deployment_config(), EngineConfig(mode=Mode.FIXED).deployment_config()
    assert (buggy["engine"], buggy["engine_version"], fixed["engine_version"]) == ("bleedwatch-sim", "1.0.0", "1.1.0")
    assert (buggy["context_length"], buggy["prefill_kv_pool_tokens"], buggy["decode_kv_pool_tokens"]) == (
        4_000,
        2_000,
        4_000,
    )
    assert buggy["safeguards"]["kv_transfer_batch_cap"] is None
    assert fixed["safeguards"] == {
        "deferred_page_release_prefill": True,
        "deferred_page_release_decode": True,
        "kv_transfer_batch_cap": 64,
        "lb_aborts_on_client_disconnect": False,
    }
    with pytest.raises(ValueError, match="at least one page"):
        EngineConfig(prefill_pool_tokens=8, page_size=16)


def test_traffic_plans_are_reproducible_and_put_over_pool_prompts_between_pool_and_context() -> None:
    a = plan(TENANTS[:4], 24, 4, 2_000, 4_000, seed=3)
    assert a == plan(TENANTS[:4], 24, 4, 2_000, 4_000, seed=3)
    over = [p for p in a if p.over_pool]
    assert len(over) == 4
    assert all(2_000 < p.words <= 4_000 for p in over)
    assert all(p.words <= 1_800 for p in a if not p.over_pool)
    assert not any(p.over_pool for p in a[:4])  # the pages hold something by then
    with pytest.raises(ValueError, match="over the pool"):
        plan(TENANTS[:2], 4, 1, 4_000, 4_000)
