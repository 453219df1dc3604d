"""A real bleedwatch for benchmarks: ``bleedwatch serve`` on loopback, on Redis and PostgreSQL.

Each run gets its own Redis key prefix and PostgreSQL schema, removed afterwards, so it never
touches other data on the same servers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import redis

from service.local_server import free_port

REDIS_URL = os.environ.get("BLEEDWATCH_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
DATABASE_URL = os.environ.get("BLEEDWATCH_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
BLEEDWATCH = str(Path(sys.executable).parent / "bleedwatch")


@dataclass(frozen=True, slots=True)
class Running:
    url: str
    env: dict[str, str]
    pid: int

    def key(self, role: str) -> str:
        out = subprocess.run(
            [BLEEDWATCH, "keys", "create", "--name", f"bench {role}", "--role", role],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return out.split()[-1]


@contextmanager
def running_service(workers: int = 1, **settings: str) -> Iterator[Running]:
    run = uuid.uuid4().hex[:8]
    schema = f"bw_bench_{run}"
    prefix = f"bwbench{run}"
    admin = psycopg.connect(DATABASE_URL, autocommit=True)
    admin.execute(f'CREATE SCHEMA "{schema}"')
    env = (
        os.environ
        | {
            "BLEEDWATCH_REDIS_URL": REDIS_URL,
            "BLEEDWATCH_DATABASE_URL": f"{DATABASE_URL}?options=-csearch_path%3D{schema}",
            "BLEEDWATCH_KEY_PREFIX": prefix,
            "BLEEDWATCH_WORKERS": str(workers),
            "BLEEDWATCH_LOG_LEVEL": "warning",
            "BLEEDWATCH_RATE_LIMIT_PER_SECOND": "0",  # the load generator is one API key
        }
        | {f"BLEEDWATCH_{k.upper()}": v for k, v in settings.items()}
    )
    server = None
    try:
        subprocess.run([BLEEDWATCH, "migrate"], env=env, check=True, capture_output=True)
        port = free_port()
        server = subprocess.Popen([BLEEDWATCH, "serve", "--port", str(port)], env=env)
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                if httpx.get(f"{url}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        yield Running(url, env, server.pid)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 1000):
            client.unlink(*keys[i : i + 1000])
        client.close()
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()
