"""``bleedwatch sim``: the simulated engine, the gateway (auth, then the tap), or traffic, as separate processes.

    bleedwatch sim engine --mode buggy --port 8500 --url http://127.0.0.1:8400 --admin-key bw_... --ingest-key bw_...
    bleedwatch sim gateway --upstream http://127.0.0.1:8500 --port 8600 --url ... --api-key bw_... --key-file key.hex
    bleedwatch sim traffic --endpoint http://127.0.0.1:8600 --requests 24 --over-pool 4

Tenants' API keys are ``sk-sim-<tenant>`` unless given as ``--tenant name=key``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.tools.sim.engine import EngineConfig
    from service.tools.sim.traffic import Sent

DEFAULT_TENANTS = ("acme", "globex", "initech", "umbrella")


def _tenants(values: list[str] | None) -> dict[str, str]:
    """key -> tenant, from ``name`` or ``name=key`` values."""
    from service.tools.sim.front import sim_keys

    if not values:
        return sim_keys(DEFAULT_TENANTS)
    keys = {}
    for value in values:
        name, sep, key = value.partition("=")
        keys[key if sep else f"sk-sim-{name}"] = name
    return keys


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    from service.tools.sim.engine import EngineConfig, Mode

    return EngineConfig(
        deployment=args.deployment,
        model=args.model,
        mode=Mode(args.mode),
        context_length=args.context_length,
        prefill_pool_tokens=args.prefill_pool,
        decode_pool_tokens=args.decode_pool,
        page_size=args.page_size,
        nodes=args.nodes,
    )


def _engine(args: argparse.Namespace) -> int:
    import uvicorn

    from service.tools.sim.engine import Engine
    from service.tools.sim.front import create_front
    from service.tools.sim.reporter import Reporter

    config = _engine_config(args)
    reporter = None
    if args.url and (args.admin_key or args.ingest_key):
        reporter = Reporter(args.url, admin_key=args.admin_key, ingest_key=args.ingest_key)
    engine = Engine(config, on_signal=reporter.signal if reporter else None)
    keys = _tenants(args.tenant)
    print(
        f"sim engine ({config.mode.value}, {config.engine_version}) deployment {config.deployment}: "
        f"context {config.context_length:,} tokens, prefill pool {config.prefill_pool_tokens:,}, "
        f"decode pool {config.decode_pool_tokens:,}, {config.nodes} node(s); "
        f"tenants {', '.join(sorted(keys.values()))}",
        file=sys.stderr,
    )
    uvicorn.run(create_front(engine, keys, reporter), host=args.host, port=args.port, log_level="warning")
    return 0


def key_file(path: str) -> str:
    """``--key-file``'s type: the key it holds, read while the flags are parsed, so that a file that
    cannot be read is a usage error that names it, not a traceback."""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read the key file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise argparse.ArgumentTypeError(f"the key file {path} is not text: it should hold the key in hex") from None


def _gateway(args: argparse.Namespace) -> int:
    import uvicorn

    from bleedwatch.fingerprint.scheme import key_from_hex
    from service.tools.sim.gateway import create_gateway

    key_hex = args.key_file or os.environ.get("BLEEDWATCH_FINGERPRINT_KEY")
    if not key_hex or not args.api_key:
        print(
            "give the fingerprint key (--key-file or BLEEDWATCH_FINGERPRINT_KEY) and an ingest --api-key",
            file=sys.stderr,
        )
        return 2
    try:
        key = key_from_hex(key_hex)
    except ValueError as exc:
        print(f"{exc} (--key-file or BLEEDWATCH_FINGERPRINT_KEY)", file=sys.stderr)
        return 2
    app = create_gateway(
        upstream_url=args.upstream,
        tenants=_tenants(args.tenant),
        bleedwatch_url=args.url,
        bleedwatch_api_key=args.api_key,
        fingerprint_key=key,
        deployment=args.deployment,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _traffic(args: argparse.Namespace) -> int:
    import httpx

    from service.tools.sim.traffic import plan, send

    keys = _tenants(args.tenant)
    by_tenant = {tenant: key for key, tenant in keys.items()}
    planned = plan(sorted(by_tenant), args.requests, args.over_pool, args.pool, args.context_length, args.seed)

    async def run() -> list[Sent]:
        async with httpx.AsyncClient(base_url=args.endpoint, timeout=120) as client:
            return await send(client, planned, args.model, by_tenant)

    sent = asyncio.run(run())
    statuses = Counter(s.status for s in sent)
    print(", ".join(f"{n} x HTTP {code}" for code, n in sorted(statuses.items())))
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("sim", help="the incident's leaky engine, a gateway and traffic (test and demo code)")
    ssub = s.add_subparsers(dest="sim_command", required=True)

    e = ssub.add_parser("engine", help="an OpenAI-compatible paged-KV engine, buggy or fixed")
    e.add_argument("--mode", choices=["buggy", "fixed"], default="buggy")
    e.add_argument("--host", default="127.0.0.1")
    e.add_argument("--port", type=int, default=8500)
    e.add_argument("--deployment", default="sim-pd-1")
    e.add_argument("--model", default="sim-open-weights-1m")
    e.add_argument("--context-length", type=int, default=4000)
    e.add_argument("--prefill-pool", type=int, default=2000, help="KV pool of a prefill node, in tokens (words)")
    e.add_argument("--decode-pool", type=int, default=4000, help="KV pool of a decode node, in tokens (words)")
    e.add_argument("--page-size", type=int, default=16)
    e.add_argument("--nodes", type=int, default=2)
    e.add_argument("--tenant", action="append", help="a tenant, as name or name=api-key (repeat)")
    e.add_argument("--url", default=os.environ.get("BLEEDWATCH_URL"), help="bleedwatch, to report config and signals")
    e.add_argument("--admin-key", default=os.environ.get("BLEEDWATCH_ADMIN_KEY"), help="to PUT the config")
    e.add_argument("--ingest-key", default=os.environ.get("BLEEDWATCH_API_KEY"), help="to POST signals")
    e.set_defaults(func=_engine)

    g = ssub.add_parser("gateway", help="a gateway: tenants' keys to X-Tenant-Id, then the tap, which fingerprints")
    g.add_argument("--upstream", required=True, help="base URL of the OpenAI-compatible engine")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8600)
    g.add_argument("--deployment", help="the upstream's deployment id (default: the engine's x-sim-deployment)")
    g.add_argument("--tenant", action="append", help="a tenant, as name or name=api-key (repeat)")
    g.add_argument("--url", default=os.environ.get("BLEEDWATCH_URL", "http://127.0.0.1:8400"))
    g.add_argument("--api-key", default=os.environ.get("BLEEDWATCH_API_KEY"), help="an ingest key")
    g.add_argument("--key-file", type=key_file, help="file holding the gateway's fingerprint key in hex")
    g.set_defaults(func=_gateway)

    t = ssub.add_parser("traffic", help="tenants' prompts from standard-library docstrings, some over the pool")
    t.add_argument("--endpoint", required=True, help="the gateway (or engine) base URL")
    t.add_argument("--model", default="sim-open-weights-1m")
    t.add_argument("--requests", type=int, default=24)
    t.add_argument("--over-pool", type=int, default=4)
    t.add_argument("--pool", type=int, default=2000)
    t.add_argument("--context-length", type=int, default=4000)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--tenant", action="append", help="a tenant, as name or name=api-key (repeat)")
    t.set_defaults(func=_traffic)
