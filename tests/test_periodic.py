"""A periodic chore outlives any error of one round: a backend's, or one nobody foresaw."""

from __future__ import annotations

import asyncio

import pytest
import redis.exceptions

from service.periodic import Periodic

pytestmark = pytest.mark.anyio


async def test_a_chore_runs_again_after_any_error() -> None:
    errors: list[Exception] = [redis.exceptions.ConnectionError("down"), AttributeError("a reset, as redis-py says it")]
    rounds = 0
    done = asyncio.Event()

    async def chore() -> None:
        nonlocal rounds
        rounds += 1
        if errors:
            raise errors.pop(0)
        done.set()

    loop = Periodic("chore", chore, 0.01)
    loop.start()
    await asyncio.wait_for(done.wait(), timeout=10)
    await loop.stop()
    assert rounds == 3
