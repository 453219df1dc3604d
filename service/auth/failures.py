"""The failed-authentication counter, apart from the gate that consults it.

``service/deps.py`` holds one per application and the gate reads it from there; with the counter
in the gate module, the gate and the deps it reads would import each other.
"""

from __future__ import annotations

import time

from service.ratelimit import RateLimiter

MAX_BLOCKED = 100_000  # addresses remembered as out of tokens, in process


class AuthFailures:
    """Failed authentications per client address: a token bucket, shared by replicas through Redis.

    The bucket only says how long to wait once a failure found it empty; that answer is kept in
    process, so an address with no tokens left is refused before its next key costs a query.
    """

    def __init__(self, limiter: RateLimiter) -> None:
        self._limiter = limiter
        self._blocked: dict[str, float] = {}  # address -> monotonic time its bucket has a token again

    def blocked(self, address: str) -> float:
        """Seconds until this address may try an unverified key again (0: now)."""
        until = self._blocked.get(address)
        if until is None:
            return 0.0
        left = until - time.monotonic()
        if left <= 0:
            del self._blocked[address]
            return 0.0
        return left

    async def failed(self, address: str) -> float:
        """Take a token for one refused key: 0 if there was one, else seconds until there is."""
        wait = await self._limiter.take(address)
        if wait > 0:
            if len(self._blocked) >= MAX_BLOCKED:
                self._blocked.clear()
            self._blocked[address] = time.monotonic() + wait
        return wait

    async def close(self) -> None:
        await self._limiter.close()
