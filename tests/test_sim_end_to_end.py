"""The incident, end to end: a leaky paged-KV engine, the gateway shim, bleedwatch catching it.

Runs on both backends. The engine knows, for the test, which pages each answer was decoded
from and whose they were; every answer it built from another tenant's pages must become a
finding naming that tenant, and the fixed engine, sent the same traffic, must yield none.
"""

from __future__ import annotations

from typing import Any

import pytest

from service.auth.keys import Role
from service.config import Settings
from service.tools.sim.engine import EngineConfig, Mode, Served
from service.tools.sim.traffic import Planned
from tests.sim_stack import Stack, sim_stack

pytestmark = pytest.mark.anyio

TENANTS = ("acme", "globex", "initech", "umbrella")
POOL, CONTEXT = 2_000, 4_000
FULL = 1_900  # a normal prompt that fills the pages an over-pool prompt attends to


def traffic() -> list[Planned]:
    """Four leaks, each tenant's text reaching one other tenant (the next test has it reach two).

    Every over-pool prompt follows a 1,900-word prompt of another tenant, with a short prompt
    of a third in between, so its answer is decoded from two other tenants' stale pages; each
    tenant's prompts are consecutive, disjoint slices of its text, so a source request is exact.
    """

    cursor: dict[str, int] = {}

    def p(tenant: str, words: int, *, stream: bool = False) -> Planned:
        start = cursor.get(tenant, 0)
        cursor[tenant] = start + words
        return Planned(tenant, words, start, stream, over_pool=words > POOL)

    return [
        p("acme", FULL),
        p("initech", 300, stream=True),
        p("globex", 2_500),  # leak: initech then acme
        p("initech", FULL, stream=True),
        p("umbrella", 2_300, stream=True),  # leak: initech
        p("globex", FULL),
        p("umbrella", 400),
        p("acme", 3_100, stream=True),  # leak: umbrella then globex
        p("umbrella", FULL),
        p("initech", 2_200),  # leak: umbrella
        p("acme", 600),  # a last normal one: nothing leaks into it
    ]


def config(mode: Mode) -> EngineConfig:
    return EngineConfig(mode=mode, context_length=CONTEXT, prefill_pool_tokens=POOL, decode_pool_tokens=CONTEXT)


async def findings(stack: Stack) -> list[dict[str, Any]]:
    resp = await stack.api.client.get("/v1/findings", headers=stack.api.headers(Role.READ))
    assert resp.status_code == 200, resp.text
    items: list[dict[str, Any]] = resp.json()["items"]
    return items


async def signals(stack: Stack) -> list[dict[str, Any]]:
    resp = await stack.api.client.get("/v1/signals", headers=stack.api.headers(Role.READ))
    assert resp.status_code == 200, resp.text
    items: list[dict[str, Any]] = resp.json()["items"]
    return items


def dominant(leak: Served) -> str:
    words: dict[str, int] = {}
    for s in leak.leaked_from:
        words[s.tenant] = words.get(s.tenant, 0) + s.words
    return max(words, key=lambda t: words[t])


async def test_every_leaked_answer_becomes_a_finding_with_its_source(settings: Settings) -> None:
    async with sim_stack(settings, config(Mode.BUGGY), TENANTS) as stack:
        sent = await stack.send(traffic())
        await stack.flush()
        # Every answer is HTTP 200, the over-pool ones too, as in the incident.
        assert [s.status for s in sent] == [200] * len(sent)
        leaks = stack.engine.history.leaks()
        assert [(s.tenant, s.prompt_tokens) for s in leaks] == [
            ("globex", 2_500),
            ("umbrella", 2_300),
            ("acme", 3_100),
            ("initech", 2_200),
        ]
        assert all(s.stale for s in leaks)
        assert {s.tenant for s in leaks[0].leaked_from} == {"acme", "initech"}

        tenant_of = {s.request_id: s.tenant for s in stack.engine.history.served}
        found = {f["recipient_request_id"]: f for f in await findings(stack)}
        assert set(found) == {s.request_id for s in leaks}  # every leak, and nothing else
        for leak in leaks:
            f = found[leak.request_id]
            truth_tenants = {s.tenant for s in leak.leaked_from}
            truth_requests = {s.request_id for s in leak.leaked_from}
            assert f["recipient_tenant"] == leak.tenant
            assert f["source_tenant"] == dominant(leak)
            assert {s["tenant"] for s in f["evidence"]["sources"]} <= truth_tenants
            # The request whose pages were read, and maybe others of the source tenant holding the
            # same words (docstrings repeat passages): never a request of anyone else.
            assert set(f["source_request_ids"]) & truth_requests
            assert {tenant_of[r] for r in f["source_request_ids"]} == {f["source_tenant"]}
            assert (f["model"], f["deployment"], f["node"]) == ("sim-open-weights-1m", "sim-pd-1", "decode-0")
            assert f["prompt_tokens"] == leak.prompt_tokens > POOL
            assert f["severity"] in ("high", "critical")

        # The engine noticed each short transfer, and said so per deployment and node.
        got = await signals(stack)
        assert sorted(s["request_id"] for s in got) == sorted(s.request_id for s in leaks)
        assert {(s["kind"], s["deployment"], s["node"]) for s in got} == {("kv_transfer_short", "sim-pd-1", "decode-0")}

        # It reported its config at start, and the risk check had flagged it already.
        dep = await stack.api.client.get("/v1/deployments/sim-pd-1", headers=stack.api.headers(Role.READ))
        assert "kv_pool_below_context_length" in {v["rule"] for v in dep.json()["violations"]}


async def test_the_fixed_engine_refuses_and_yields_no_finding(settings: Settings) -> None:
    async with sim_stack(settings, config(Mode.FIXED), TENANTS) as stack:
        sent = await stack.send(traffic())
        await stack.flush()
        statuses = [(s.planned.over_pool, s.status) for s in sent]
        assert statuses == [(p.over_pool, 400 if p.over_pool else 200) for p in traffic()]
        assert all("prefill KV pool" in (s.error or "") for s in sent if s.planned.over_pool)
        assert stack.engine.history.leaks() == []
        assert stack.gateway.stats.submitted == sum(1 for s in sent if s.status == 200)
        assert await findings(stack) == []
        assert await signals(stack) == []
        dep = await stack.api.client.get("/v1/deployments/sim-pd-1", headers=stack.api.headers(Role.READ))
        assert dep.json()["engine_version"] == "1.1.0"
        assert [v["rule"] for v in dep.json()["violations"]] == ["kv_pool_below_context_length"]


async def test_one_tenants_text_leaked_to_two_tenants_is_two_findings(settings: Settings) -> None:
    """Stale pages stay stale: a second over-pool prompt on the node reads the same ones.

    Two recipients plus the source make three tenants holding the text; it must not count as
    common boilerplate (shared by three *senders*), or the second leak would go unreported.
    """
    async with sim_stack(settings, config(Mode.BUGGY), TENANTS) as stack:
        await stack.send([Planned("acme", FULL, 0, False, False), Planned("globex", 2_500, 0, False, True)])
        await stack.flush()
        await stack.send([Planned("initech", 2_400, 0, False, True)])
        await stack.flush()
        leaks = stack.engine.history.leaks()
        assert [(s.tenant, dominant(s)) for s in leaks] == [("globex", "acme"), ("initech", "acme")]
        found = {f["recipient_request_id"]: f["source_tenant"] for f in await findings(stack)}
        assert found == {s.request_id: "acme" for s in leaks}
