"""What the benchmarks send, and a lean HTTP client to send it with.

Traffic (``chat_traffic``): tenants with system prompts shared among several of them (text that
must become common), multi-turn chats resending the tenant's previous turn, answers quoting
their own question, a small share of long-context prompts, and a few real leaks (another
tenant's recent prompt in an answer) so matching and findings run as they would in production.
Words (alphabetic ones, one token each) are drawn from the stdlib docstring corpus by their
frequency there, so text reads like prose to the tokenizer but n-grams are as unique as users'
own text is; the shared parts are verbatim corpus passages.

The client (``Poster``) speaks HTTP/1.1 over keep-alive connections with the request bytes
built before timing: the load generator shares the machine's cores with the service and
Redis, so it must spend as little CPU as it can per batch.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from bench.corpus import docstrings
from bleedwatch.exchange import fingerprint_exchange
from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS, Params

KEY = bytes(range(32, 64))


@dataclass(frozen=True, slots=True)
class Mix:
    tenants: int = 50
    long_share: float = 0.01  # prompts of 20k-50k words
    leak_share: float = 0.002  # answers carrying 60 words of another tenant's recent prompt
    followup_share: float = 0.3  # prompts that resend the tenant's previous turn
    quote_share: float = 0.2  # answers quoting 20-40 words of their own prompt
    system_prompts: int = 10  # shared by the tenants: each tenant uses one


@dataclass
class _Words:
    vocab: list[str]
    weights: np.ndarray
    passages: list[list[str]]

    def random(self, rng: np.random.Generator, n: int) -> list[str]:
        idx = rng.choice(len(self.vocab), size=n, p=self.weights)
        return [self.vocab[i] for i in idx]


def _corpus() -> _Words:
    passages = docstrings()
    counts: dict[str, int] = {}
    for words in passages:
        for w in words:
            if w.isalpha():  # one token each: "b'\\xea'" would be a fixed run of tokens, a fake shared phrase
                counts[w] = counts.get(w, 0) + 1
    vocab = sorted(counts)
    weights = np.array([counts[w] for w in vocab], dtype=np.float64)
    return _Words(vocab, weights / weights.sum(), passages)


@dataclass(frozen=True, slots=True)
class TextPair:
    tenant: str
    request_id: str
    prompt: str
    response: str
    leak_from: str | None = None


def chat_texts(n: int, mix: Mix, seed: int, prefix: str = "bench") -> list[TextPair]:
    rng = np.random.default_rng(seed)
    pyrng = random.Random(seed)
    words = _corpus()
    systems = [" ".join(pyrng.choice(words.passages)[:200]) for _ in range(mix.system_prompts)]
    tenant_system = {t: systems[t % len(systems)] for t in range(mix.tenants)}
    last_turn: dict[int, str] = {}
    recent: list[tuple[str, list[str]]] = []
    out = []
    for i in range(n):
        t = int(rng.integers(mix.tenants))
        long = rng.random() < mix.long_share
        user = words.random(rng, int(rng.integers(20_000, 50_000)) if long else int(rng.integers(150, 1200)))
        parts = [tenant_system[t]]
        if t in last_turn and rng.random() < mix.followup_share:
            parts.append(last_turn[t])
        parts.append(" ".join(user))
        prompt = " ".join(parts)
        last_turn[t] = " ".join(user[:300])
        answer = words.random(rng, int(rng.integers(60, 400)))
        if rng.random() < mix.quote_share:
            start = int(rng.integers(0, max(1, len(user) - 40)))
            answer[10:10] = user[start : start + int(rng.integers(20, 40))]
        leak_from = None
        others = [r for r in recent if r[0] != f"tenant-{t}"]
        if others and rng.random() < mix.leak_share:
            source_id, source_words = others[int(rng.integers(len(others)))]
            start = int(rng.integers(0, max(1, len(source_words) - 60)))
            answer[20:20] = source_words[start : start + 60]
            leak_from = source_id
        out.append(TextPair(f"tenant-{t}", f"{prefix}-{i}", prompt, " ".join(answer), leak_from))
        recent.append((f"{prefix}-{i}", user[:400]))
        recent = recent[-200:]
    return out


def _fingerprint(pair: TextPair, ts: float, params: Params) -> dict[str, Any]:
    return fingerprint_exchange(
        pair.prompt,
        pair.response,
        key=KEY,
        tenant=pair.tenant,
        request_id=pair.request_id,
        model="bench-model",
        ts=ts,
        meta={"deployment": "bench", "node": "n1"},
        params=params,
    )


def fingerprint_all(
    pairs: Sequence[TextPair], processes: int = 2, params: Params = DEFAULT_PARAMS
) -> list[dict[str, Any]]:
    """The SDK's wire form of every exchange, fingerprinted before any timing starts."""
    ts = time.time()
    with ProcessPoolExecutor(processes) as pool:
        return list(pool.map(_fingerprint, pairs, [ts] * len(pairs), [params] * len(pairs), chunksize=32))


def fingerprint_count(exchange: dict[str, Any]) -> int:
    return sum(len(exchange[side]["fingerprints"]) * 3 // 4 // 8 for side in ("prompt", "response"))


def new_run_id() -> str:
    return secrets.token_hex(4)


@dataclass
class Poster:
    """HTTP/1.1 keep-alive POSTs of prepared bodies; each call returns (status, body, seconds)."""

    host: str
    port: int
    token: str
    connections: int = 8
    respond_async: bool = True  # as the SDK: answered once queued (False: once processed)
    _pool: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(init=False)

    async def __aenter__(self) -> Poster:
        self._pool = asyncio.Queue()
        for _ in range(self.connections):
            self._pool.put_nowait(await asyncio.open_connection(self.host, self.port))
        return self

    async def __aexit__(self, *_: object) -> None:
        while not self._pool.empty():
            _reader, writer = self._pool.get_nowait()
            writer.close()

    def request(self, body: bytes, path: str = "/v1/exchanges") -> bytes:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {self.token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            + ("Prefer: respond-async\r\n" if self.respond_async else "")
            + "\r\n"
        ).encode()
        return head + body

    async def post(self, request: bytes) -> tuple[int, bytes]:
        reader, writer = await self._pool.get()
        try:
            writer.write(request)
            status_line = await reader.readline()
            if not status_line:  # the server closed an idle keep-alive connection: once more on a new one
                writer.close()
                reader, writer = await asyncio.open_connection(self.host, self.port)
                writer.write(request)
                status_line = await reader.readline()
            status = int(status_line.split()[1])
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await reader.readexactly(length)
        except BaseException:
            writer.close()
            self._pool.put_nowait(await asyncio.open_connection(self.host, self.port))
            raise
        self._pool.put_nowait((reader, writer))
        return status, body


def batches(exchanges: list[dict[str, Any]], size: int) -> list[tuple[bytes, int, int]]:
    """(body, exchanges, fingerprints) of each batch."""
    out = []
    for i in range(0, len(exchanges), size):
        part = exchanges[i : i + size]
        out.append((orjson.dumps({"exchanges": part}), len(part), sum(fingerprint_count(ex) for ex in part)))
    return out


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its children that were waited for (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = sum(int(x) for x in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (uvicorn workers), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out
