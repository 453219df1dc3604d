"""``bleedwatch demo``: the whole path on the embedded default, in one process, in seconds.

Starts the API on a free loopback port with a throw-away SQLite file and in-process index,
creates an ingest and a read key, replays the built-in sample through the SDK and prints what a
responder gets back from ``GET /v1/findings``.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from service.app import create_app
from service.auth.keys import Role, create_key
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.demo.sample import sample
from service.local_server import local_server
from service.migrate import upgrade
from service.replay import replay_records


async def _keys(settings: Settings) -> tuple[str, str]:
    engine = make_engine(settings)
    async with session_scope(make_sessionmaker(engine)) as session:
        _, ingest = await create_key(session, "demo gateway", Role.INGEST)
        _, read = await create_key(session, "demo responder", Role.READ)
    await engine.dispose()
    return ingest, read


def _print_finding(f: dict[str, Any]) -> None:
    print(f"  finding {f['id']}  severity {f['severity']}  score {f['score']:.2f}")
    print(f"    {f['source_tenant']}'s content reached {f['recipient_tenant']} in response {f['recipient_request_id']}")
    print(
        f"    source requests {', '.join(f['source_request_ids'])}; model {f['model']}, "
        f"deployment {f['deployment']}, node {f['node']}, prompt {f['prompt_tokens']} tokens"
    )
    print(f"    {f['matched_fingerprints']} fingerprints matched, longest run {f['longest_run_words']} words")
    for src in f["evidence"]["sources"]:
        for r in src["ranges"]:
            print(
                f"    words {r['response'][0]}-{r['response'][1]} of the response = words "
                f"{r['source'][0]}-{r['source'][1]} of {src['tenant']}'s {r['source_kind']} {r['source_request_id']}"
            )


def run_demo(*, keep: bool = False) -> int:
    data_dir = Path(tempfile.mkdtemp(prefix="bleedwatch-demo-"))
    settings = Settings(redis_url=None, database_url=None, data_dir=data_dir)
    upgrade(settings)
    ingest_key, read_key = asyncio.run(_keys(settings))
    try:
        with local_server(create_app(settings)) as url:
            records = sample(time.time() - 60)
            print(f"bleedwatch demo: embedded index + SQLite in {data_dir}, API on {url}")
            print(
                f"replaying {len(records)} exchanges from 4 tenants (shared system prompt, a self-echo, one leak;"
                " the leaked response is sent before its source)"
            )
            # Two exchanges a batch, so the leak and its source arrive in different requests.
            result = asyncio.run(
                replay_records(records, url=url, api_key=ingest_key, key=secrets.token_bytes(32), batch_size=2)
            )
            print(f"sent {result.sent}: {result.accepted} accepted, {result.findings} findings")
            reply = httpx.get(f"{url}/v1/findings", headers={"Authorization": f"Bearer {read_key}"})
            found = reply.json()["items"]
            print(f"GET /v1/findings -> {len(found)} finding(s)")
            for f in found:
                _print_finding(f)
            return 0 if len(found) == 1 else 1
    finally:
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)
