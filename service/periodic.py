"""One background loop for the app's periodic chores (gauges from the database, pruning).

A failure of a backend (database, Redis, network) is logged and retried at the next tick:
a chore must never take the service down with it. Anything else is logged with its traceback
and retried too: a loop that ended would leave the replica serving with a chore silently gone
(held findings never written, abandoned batches never reclaimed), and redis-py itself lets
some connection resets out as ``AttributeError`` or ``TypeError`` (redis/redis-py#4287).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import redis.exceptions
import sqlalchemy.exc

log = logging.getLogger("bleedwatch.periodic")

BACKEND_ERRORS = (sqlalchemy.exc.SQLAlchemyError, redis.exceptions.RedisError, OSError)


class Periodic:
    def __init__(
        self, name: str, job: Callable[[], Awaitable[object]], interval_seconds: float, *, first_delay: float = 0.0
    ) -> None:
        self.name = name
        self._job = job
        self._interval = interval_seconds
        self._first_delay = first_delay
        self._task: asyncio.Task[None] | None = None

    async def run_quietly(self) -> None:
        try:
            await self._job()
        except BACKEND_ERRORS as exc:
            log.warning("%s failed, retried at the next tick", self.name, extra={"exc_type": type(exc).__name__})
        except Exception as exc:
            log.exception("%s raised, retried at the next tick", self.name, extra={"exc_type": type(exc).__name__})

    def start(self) -> None:
        if self._interval > 0:
            self._task = asyncio.create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        await asyncio.sleep(self._first_delay)
        task = asyncio.current_task()
        while True:
            await self.run_quietly()
            if task is not None and task.cancelling():
                # Cancelled during the job, and the job's client (redis-py does this) swallowed or
                # replaced the CancelledError: stop anyway, or stop() would wait forever.
                raise asyncio.CancelledError
            await asyncio.sleep(self._interval)
