"""How an engine talks to bleedwatch: its serving config at start, its integrity signals as they happen.

The config goes to ``PUT /v1/deployments/{id}`` (an admin key: it is the deployment's record);
signals are batched to ``POST /v1/signals`` (an ingest key). Neither carries any text. A
bleedwatch that is down never stops the engine: failures are logged and signals kept for the
next flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx

from bleedwatch.plural import counted
from service.tools.sim.engine import Signal

log = logging.getLogger("bleedwatch.sim")


def _error_code(resp: httpx.Response) -> str:
    """The error code of a refusal (service/errors.py's shape), never its body: logs carry no text."""
    try:
        body = resp.json()
    except ValueError:
        return "(no JSON error body)"
    code = body.get("error") if isinstance(body, dict) else None
    return code if isinstance(code, str) else "(no error code)"


class Reporter:
    def __init__(
        self,
        url: str,
        *,
        admin_key: str | None,
        ingest_key: str | None,
        flush_seconds: float = 0.5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(base_url=url.rstrip("/"), timeout=10.0, transport=transport)
        self._admin_key = admin_key
        self._ingest_key = ingest_key
        self._flush_seconds = flush_seconds
        self._pending: list[Signal] = []
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0

    async def start(self, deployment: str, config: dict[str, Any]) -> dict[str, Any] | None:
        """Report the config and start flushing signals; returns bleedwatch's record of the deployment."""
        self._task = asyncio.create_task(self._flush_periodically())
        return await self.report_config(deployment, config)

    async def report_config(self, deployment: str, config: dict[str, Any]) -> dict[str, Any] | None:
        if self._admin_key is None:
            log.warning("no bleedwatch admin key: the deployment's config is not reported")
            return None
        try:
            resp = await self._http.put(
                f"/v1/deployments/{quote(deployment, safe='')}", json=config, headers=_auth(self._admin_key)
            )
        except httpx.HTTPError as exc:
            log.warning("bleedwatch unreachable, config not reported: %r", exc)
            return None
        if resp.status_code not in (200, 201):
            log.warning("bleedwatch refused the config: %s %s", resp.status_code, _error_code(resp))
            return None
        record: dict[str, Any] = resp.json()
        return record

    def signal(self, signal: Signal) -> None:
        self._pending.append(signal)

    async def flush(self) -> None:
        async with self._lock:
            if not self._pending or self._ingest_key is None:
                return
            batch, self._pending = self._pending, []
            events = [
                {
                    "kind": s.kind,
                    "deployment": s.deployment,
                    "node": s.node,
                    "ts": datetime.fromtimestamp(s.ts, UTC).isoformat(),
                    "request_id": s.request_id,
                    "count": s.count,
                    "event_id": f"{s.request_id}:{s.kind}",
                }
                for s in batch
            ]
            try:
                resp = await self._http.post("/v1/signals", json={"events": events}, headers=_auth(self._ingest_key))
            except httpx.HTTPError as exc:
                self._pending = batch + self._pending
                log.warning("bleedwatch unreachable, %s kept for later: %r", counted(len(batch), "signal"), exc)
                return
            if resp.status_code == 202:
                self.sent += len(batch)
            elif resp.status_code in (429, 502, 503, 504):
                self._pending = batch + self._pending
            else:
                log.error(
                    "bleedwatch refused %s: %s %s", counted(len(batch), "signal"), resp.status_code, _error_code(resp)
                )

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.flush()
        finally:
            await self._http.aclose()

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._flush_seconds)
            await self.flush()


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
