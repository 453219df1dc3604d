"""``bleedwatch keys``: straight on the database, so the first admin key needs no API; audited as ``cli``,
in the same transaction, like the API's key routes (an admin key minted from a shell is no less one)."""

from __future__ import annotations

import argparse
import contextlib

import redis.exceptions
from redis.asyncio import Redis

from service.audit import log as audit
from service.auth.keys import Role, create_key, list_keys, revoke_key
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.index.keys import Keys


async def run(args: argparse.Namespace) -> int:
    settings = Settings()
    if args.keys_command == "create" and args.tenants and args.role != Role.INGEST.value:
        print("--tenant: only ingest keys can be limited to tenants")
        return 2
    engine = make_engine(settings)
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            if args.keys_command == "create":
                key, token = await create_key(session, args.name, Role(args.role), args.tenants)
                detail = {"role": key.role, "tenant_limited": bool(key.tenants)}
                await audit.record(session, audit.CLI, "keys.create", f"key:{key.id}", detail)
            elif args.keys_command == "list":
                await audit.record(session, audit.CLI, "keys.list", "keys")
                keys = await list_keys(session)
            elif revoked := await revoke_key(session, args.key_id):
                await audit.record(session, audit.CLI, "keys.revoke", f"key:{args.key_id}")
    finally:
        await engine.dispose()
    # Committed: a secret shown is a key that exists, and replicas told of a revocation cannot reload it active.
    if args.keys_command == "create":
        print(f"created key {key.id} ({key.role}); the secret is shown once:\n{token}")
    elif args.keys_command == "list":
        for k in keys:
            state = "revoked" if k.revoked_at else "active"
            used = k.last_used_at.isoformat() if k.last_used_at else "never"
            print(f"{k.id}  {k.role:<7} {state:<8} last used {used:<32} {k.name}")
    elif not revoked:
        print(f"no active key {args.key_id}")
        return 1
    else:
        print(f"revoked {args.key_id}")
        await _announce(settings, args.key_id)
    return 0


async def _announce(settings: Settings, key_id: str) -> None:
    """Running replicas drop the key at once (service/auth/revocations.py); else within their cache period."""
    if settings.redis_url is None:
        return
    client = Redis.from_url(settings.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
    with contextlib.suppress(redis.exceptions.RedisError, OSError):
        await client.publish(Keys(settings.key_prefix).revocations(), key_id)
    await client.aclose()
