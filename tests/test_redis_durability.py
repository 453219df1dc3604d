"""202 means durable: an instance says when the Redis it uses would lose accepted batches.

Against redis-servers of our own: one as docker-compose.yml runs it (AOF everysec, noeviction),
one with no AOF and an evicting policy; /readyz names what is missing and
``bleedwatch_redis_persistence_ok`` is what BleedwatchRedisNotPersistent alerts on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from service.config import Settings
from tests.conftest import _truncate as truncate
from tests.conftest import running_api
from tests.observability import ROOT
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.anyio
AS_SHIPPED = ("--appendfsync", "everysec", "--maxmemory", "64mb", "--maxmemory-policy", "noeviction")


def _gauge(metrics_text: str) -> float:
    line = next(x for x in metrics_text.splitlines() if x.startswith("bleedwatch_redis_persistence_ok "))
    return float(line.split()[1])


@pytest.mark.parametrize(
    ("durable", "args", "expected"),
    [
        (True, AS_SHIPPED, "ok"),
        (False, ("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"), "no_aof,evicts:allkeys-lru"),
        (True, ("--maxmemory-policy", "volatile-ttl"), "evicts:volatile-ttl"),
    ],
)
async def test_readyz_and_the_gauge_say_whether_redis_persists(
    tmp_path: Path, pg_url: str, durable: bool, args: tuple[str, ...], expected: str
) -> None:
    server = RedisServer(tmp_path / "redis", durable=durable, args=args)
    server.start()
    try:
        truncate(pg_url)
        settings = Settings(redis_url=server.url, database_url=pg_url, key_prefix="dur", data_dir=tmp_path)
        async with running_api(settings) as api:
            ready = await api.client.get("/readyz")
            assert ready.status_code == 200  # still ready: refusing traffic would lose more
            assert ready.json()["durability"] == expected
            assert _gauge((await api.client.get("/metrics")).text) == (1.0 if expected == "ok" else 0.0)
    finally:
        server.kill()


async def test_the_embedded_index_reports_that_nothing_persists(tmp_path: Path) -> None:
    async with running_api(Settings(redis_url=None, database_url=None, data_dir=tmp_path)) as api:
        assert (await api.client.get("/readyz")).json()["durability"] == "in_process"
        assert _gauge((await api.client.get("/metrics")).text) == 0.0


def test_compose_runs_redis_with_aof_everysec_and_noeviction() -> None:
    command = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["redis"]["command"]
    flags = dict(zip(command[1::2], command[2::2], strict=True))
    assert flags["--appendonly"] == "yes"
    # everysec unless the operator chooses always (REDIS_APPENDFSYNC; the fault drill gives its cost)
    assert flags["--appendfsync"] == "${REDIS_APPENDFSYNC:-everysec}"
    assert flags["--maxmemory-policy"] == "noeviction"
    assert flags["--maxmemory"]
