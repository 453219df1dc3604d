"""``bleedwatch replay``: a JSON Lines traffic file through the SDK, as a gateway would send it.

One exchange a line: ``{"ts", "tenant", "request_id", "model", "prompt", "response", "meta"}``,
``ts`` in epoch seconds or ISO 8601.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from bleedwatch.client import BleedwatchClient
from bleedwatch.exchange import fingerprint_exchange


@dataclass(frozen=True, slots=True)
class ReplayResult:
    sent: int
    accepted: int
    duplicates: int
    findings: int
    rate: float


def read_traffic(path: str | Path) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            try:
                exchange = _exchange(record)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: {exc}") from None
            yield exchange


def _exchange(record: Any) -> dict[str, Any]:
    """The line's exchange with its time parsed; a ValueError that says what to fix if it is none."""
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    missing = {"ts", "tenant", "request_id", "model", "prompt", "response"} - record.keys()
    if missing:
        raise ValueError(f"missing {', '.join(sorted(missing))}")
    for field in ("tenant", "request_id", "model", "prompt", "response"):
        if not isinstance(record[field], str):
            raise ValueError(f"{field} is not a string")
    if not isinstance(record.get("meta") or {}, dict):
        raise ValueError("meta is not an object")
    try:
        return record | {"ts": _ts(record["ts"])}
    except (TypeError, ValueError):
        raise ValueError("ts is neither epoch seconds nor ISO 8601") from None


def _ts(value: Any) -> float | datetime:
    if isinstance(value, bool):
        raise TypeError("a boolean is no time")
    return datetime.fromisoformat(value) if isinstance(value, str) else float(value)


class Progress:
    """A one-line progress bar on stderr when it is a terminal, a final line otherwise."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.tty = sys.stderr.isatty()

    def update(self, done: int) -> None:
        if self.tty:
            width = 30
            filled = width * done // max(self.total, 1)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


async def replay_records(
    records: Iterable[dict[str, Any]], total: int, *, url: str, api_key: str, key: bytes, batch_size: int = 200
) -> ReplayResult:
    start = time.perf_counter()
    progress = Progress(total)
    sent = 0
    async with BleedwatchClient(url, api_key, batch_size=batch_size, wait_for_processing=True) as client:
        for sent, r in enumerate(records, 1):
            await client.submit(
                fingerprint_exchange(
                    r["prompt"],
                    r["response"],
                    key=key,
                    tenant=r["tenant"],
                    request_id=r["request_id"],
                    model=r["model"],
                    ts=r["ts"],
                    meta=r.get("meta") or {},
                )
            )
            progress.update(sent)
        await client.flush()
    progress.close()
    elapsed = time.perf_counter() - start
    return ReplayResult(sent, client.accepted, client.duplicates, client.findings, sent / elapsed)


async def replay_file(path: str, *, url: str, api_key: str, key: bytes, batch_size: int = 200) -> ReplayResult:
    """Two passes: the first checks every line, so that a bad one stops the replay before anything is
    sent, and counts them for the progress bar; the second sends, a batch in memory at a time."""
    total = sum(1 for _ in read_traffic(path))
    return await replay_records(read_traffic(path), total, url=url, api_key=api_key, key=key, batch_size=batch_size)
