"""``bleedwatch demo``: the incident, end to end, on this machine, in seconds.

bleedwatch (embedded: in-process index, throw-away SQLite file), the simulated paged-KV engine
behind its OpenAI-compatible front, and a gateway that authenticates tenants and reports through
``bleedwatch tap`` (the product's reverse proxy, service/tap/), each on its own loopback port. The
engine reports its serving config at start, so the risk check speaks before any traffic;
tenants then send prompts through the gateway, a few longer than the prefill KV pool. With the
engine's bug those are answered 200 from other tenants' stale KV pages, and bleedwatch turns
every such answer into a finding; the same traffic against the fixed engine gets 400s for the
over-long prompts and no finding. Exit status 0 only if that is what happened.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bleedwatch.plural import counted
from service.app import create_app
from service.auth.keys import Role, create_key
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.local_server import local_server
from service.migrate import upgrade
from service.tools.sim.engine import Engine, EngineConfig, History, Mode
from service.tools.sim.front import create_front, sim_keys
from service.tools.sim.gateway import create_gateway
from service.tools.sim.reporter import Reporter
from service.tools.sim.traffic import Planned, Sent, plan, send

TENANTS = ("acme", "globex", "initech", "umbrella")
REQUESTS = 24
OVER_POOL = 4

# The incident's production config, as its report gives it. The report states the prefill pool
# only; the decode pool is taken as the context length here.
INCIDENT_DEPLOYMENT = "incident-pd-1m"
INCIDENT_CONFIG: dict[str, Any] = {
    "model": "open-weights-1m",
    "engine": "sglang",
    "engine_version": "as-deployed",
    "disaggregated": True,
    "context_length": 1_048_576,
    "prefill_kv_pool_tokens": 681_280,
    "decode_kv_pool_tokens": 1_048_576,
    "safeguards": {
        "deferred_page_release_prefill": False,
        "deferred_page_release_decode": False,
        "kv_transfer_batch_cap": None,
        "lb_aborts_on_client_disconnect": True,
    },
}


@dataclass(frozen=True, slots=True)
class Run:
    mode: Mode
    sent: list[Sent]
    history: History
    findings: list[dict[str, Any]]
    signals: list[dict[str, Any]]
    deployment: dict[str, Any]


async def _keys(settings: Settings) -> dict[Role, str]:
    engine = make_engine(settings)
    tokens = {}
    async with session_scope(make_sessionmaker(engine)) as session:
        for role in (Role.ADMIN, Role.INGEST, Role.READ):
            _, tokens[role] = await create_key(session, f"demo {role.value}", role)
    await engine.dispose()
    return tokens


def _violations(record: dict[str, Any], indent: str = "    ") -> None:
    if not record["violations"]:
        print(f"{indent}no risk rule violated")
    for v in record["violations"]:
        print(f"{indent}{v['severity']:<8} {v['rule']}: {v['detail']}")


def _when(iso: str) -> str:
    return datetime.fromisoformat(iso).strftime("%H:%M:%S.%f")[:-3]


def _processed(reader: httpx.Client, timeout_seconds: float = 60.0) -> None:
    """Until bleedwatch has processed every batch the gateway delivered (answered once queued), and
    written every finding: one the database could not take at once waits in the outbox."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        status = reader.get("/v1/queue").json()
        if not status["queued"] and not status["findings_held"]:
            return
        time.sleep(0.05)


def _run_engine(
    mode: Mode, traffic: list[Planned], bw_url: str, tokens: dict[Role, str], key: bytes, reader: httpx.Client
) -> Run:
    config = EngineConfig(mode=mode, nodes=2)
    keys = sim_keys(TENANTS)
    reporter = Reporter(bw_url, admin_key=tokens[Role.ADMIN], ingest_key=tokens[Role.INGEST], flush_seconds=0.25)
    engine = Engine(config, on_signal=reporter.signal)
    started = datetime.now().astimezone()
    with local_server(create_front(engine, keys, reporter)) as engine_url:
        gateway = create_gateway(
            upstream_url=engine_url,
            tenants=keys,
            bleedwatch_url=bw_url,
            bleedwatch_api_key=tokens[Role.INGEST],
            fingerprint_key=key,
            flush_seconds=0.25,
        )
        with local_server(gateway) as gateway_url:

            async def traffic_run() -> list[Sent]:
                async with httpx.AsyncClient(base_url=gateway_url, timeout=60) as client:
                    return await send(client, traffic, config.model, {t: k for k, t in keys.items()})

            sent = asyncio.run(traffic_run())
        # Leaving the gateway and the engine shuts them down: the gateway flushes its last
        # exchanges to bleedwatch, the engine its last signals.
    _processed(reader)
    since = {"since": started.isoformat()}
    findings = reader.get("/v1/findings", params=since | {"limit": "500"}).json()["items"]
    signals = reader.get("/v1/signals", params=since | {"deployment": config.deployment}).json()["items"]
    deployment = reader.get(f"/v1/deployments/{config.deployment}").json()
    return Run(mode, sent, engine.history, findings, signals, deployment)


def _print_run(run: Run, pool: int) -> None:
    statuses = Counter(s.status for s in run.sent)
    over = [s for s in run.sent if s.planned.over_pool]
    requests = counted(len(run.sent), "request")
    print(f"  {requests} from {len(TENANTS)} tenants, {len(over)} longer than the {pool:,}-token pool")
    print(f"  HTTP answers: {', '.join(f'{n} x {code}' for code, n in sorted(statuses.items()))}")
    for s in over:
        what = f"{s.status}, {len(s.content.split())}-word answer" if s.status == 200 else f"{s.status}: {s.error}"
        print(f"    {s.planned.tenant:<9} prompt of {s.planned.words:,} tokens -> {what}")
    leaks = run.history.leaks()
    stale = [s for s in run.history.served if s.stale]
    print(
        f"  engine: {counted(len(stale), 'request')} decoded over stale KV pages, "
        f"{counted(len(leaks), 'answer')} carried other tenants' text; "
        f"{counted(len(run.history.signals), 'kv_transfer_short signal')}"
    )
    print(f"  bleedwatch: {counted(len(run.findings), 'finding')}")
    for f in sorted(run.findings, key=lambda f: f["response_at"]):
        lag = datetime.fromisoformat(f["detected_at"]) - datetime.fromisoformat(f["response_at"])
        print(
            f"    [{f['severity']}] {f['source_tenant']}'s prompt text reached {f['recipient_tenant']} "
            f"in {f['recipient_request_id']}"
        )
        print(
            f"      deployment {f['deployment']}, node {f['node']}, model {f['model']}; "
            f"recipient's prompt {f['prompt_tokens']:,} tokens"
        )
        print(
            f"      from {f['source_tenant']}'s {', '.join(f['source_request_ids'])}; longest verbatim run "
            f"{f['longest_run_tokens']} tokens; served {_when(f['response_at'])}, "
            f"found {lag.total_seconds():.1f} s later"
        )
    if run.signals:
        nodes = Counter(s["node"] for s in run.signals)
        per_node = ", ".join(f"{n} on {node}" for node, n in sorted(nodes.items()))
        print(f"  GET /v1/signals: {len(run.signals)} kv_transfer_short ({per_node}), beside the findings")
    if leaks:
        found = {f["recipient_request_id"]: f for f in run.findings}
        caught = [s for s in leaks if s.request_id in found]
        right = [s for s in caught if found[s.request_id]["source_tenant"] in {x.tenant for x in s.leaked_from}]
        print(f"  every leak the engine knows of: {len(caught)}/{len(leaks)} found, {len(right)} with the right source")
        for leak in leaks:
            if leak.request_id not in found:
                sources = ", ".join(f"{x.tenant}'s {x.request_id}" for x in leak.leaked_from)
                print(f"    missed: {leak.request_id} to {leak.tenant}, built from {sources}")


def run_demo(*, keep: bool = False) -> int:
    started = time.perf_counter()
    data_dir = Path(tempfile.mkdtemp(prefix="bleedwatch-demo-"))
    settings = Settings(redis_url=None, database_url=None, data_dir=data_dir)
    upgrade(settings)
    tokens = asyncio.run(_keys(settings))
    key = secrets.token_bytes(32)  # the gateway's fingerprint key: bleedwatch never sees it
    sim = EngineConfig()
    traffic = plan(TENANTS, REQUESTS, OVER_POOL, sim.prefill_pool_tokens, sim.context_length, seed=4)
    try:
        with local_server(create_app(settings)) as bw_url:
            admin = httpx.Client(base_url=bw_url, headers={"Authorization": f"Bearer {tokens[Role.ADMIN]}"})
            reader = httpx.Client(base_url=bw_url, headers={"Authorization": f"Bearer {tokens[Role.READ]}"})
            print(f"bleedwatch demo: bleedwatch on {bw_url} (embedded index + SQLite in {data_dir})")
            print(
                "The incident: the prefill KV pool held 681,280 tokens for a 1,048,576-token context; an engine bug\n"
                "let longer prompts through to decode, which attended to pages still holding other customers' KV\n"
                "cache, and the answers went out as HTTP 200. Here the same engine logic, scaled down: a prefill pool\n"
                f"of {sim.prefill_pool_tokens:,} tokens (words), a decode pool of {sim.decode_pool_tokens:,}, "
                f"a {sim.context_length:,}-token context, {sim.page_size}-token pages, 2 decode nodes."
            )
            print("\n1. Risk check, before any traffic")
            record = admin.put(f"/v1/deployments/{INCIDENT_DEPLOYMENT}", json=INCIDENT_CONFIG).json()
            print(
                f"  the incident's own config, PUT /v1/deployments/{INCIDENT_DEPLOYMENT} "
                "(the report gives no decode pool: taken as the context length):"
            )
            _violations(record)

            print("\n2. The buggy engine (sim 1.0.0)")
            buggy = _run_engine(Mode.BUGGY, traffic, bw_url, tokens, key, reader)
            print(f"  it reported its config at start, PUT /v1/deployments/{buggy.deployment['id']}:")
            _violations(buggy.deployment)
            _print_run(buggy, sim.prefill_pool_tokens)
            gauges = [
                line
                for line in httpx.get(f"{bw_url}/metrics").text.splitlines()
                if line.startswith("bleedwatch_deployment_risk_violations{")
            ]
            print("  /metrics, for the alert (BleedwatchDeploymentRisk):")
            for line in gauges:
                print(f"    {line}")

            print("\n3. The fixed engine (sim 1.1.0), the same traffic")
            fixed = _run_engine(Mode.FIXED, traffic, bw_url, tokens, key, reader)
            _print_run(fixed, sim.prefill_pool_tokens)
            print("  risk check now:")
            _violations(fixed.deployment)
            admin.close()
            reader.close()
        ok = bool(buggy.findings) and not fixed.findings
        print(
            f"\nresult: buggy engine {counted(len(buggy.findings), 'finding')}, fixed engine {len(fixed.findings)}: "
            f"{'as expected' if ok else 'NOT as expected'} ({time.perf_counter() - started:.1f} s)"
        )
        return 0 if ok else 1
    finally:
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)
