"""A paged-KV inference engine in prefill/decode disaggregated mode, with the incident's bug.

Tokens are words. Every node pairs a prefill pool and a decode pool, each a fixed number of
pages of ``page_size`` token slots shared by all requests. Pages are never zeroed: the engine
alone knows which request a page belongs to, and a released page keeps its contents until a
later request overwrites them. A request, one scheduler step on one node:

1. decode reserves pages for the whole prompt in its pool, as a disaggregated decode server
   pre-allocates KV space before the transfer;
2. prefill allocates pages in its pool and writes the prompt's tokens (its "KV") into them;
3. the KV transfer copies them into the reserved decode pages; prefill releases its pages;
4. decode attends to its pages and the model answers from what it finds there;
5. decode releases its pages, contents and all.

The bug (``mode="buggy"``): a prompt that does not fit the prefill pool is refused by prefill,
but the refusal travels as a 1-token placeholder transfer. Decode sees a completed transfer,
takes all its reserved pages as written, and attends to what earlier requests left in them:
other tenants' prompts. The answer goes out as HTTP 200, streamed if asked. The engine can tell
that the transfer was short, and reports a ``kv_transfer_short`` integrity signal.
``mode="fixed"`` refuses such a prompt with HTTP 400 and decodes nothing.

The "model" is deterministic and cheap: a paraphrase (every other word of the start of its
context) followed by a few verbatim quotes spread over the context, so an answer is a function
of what sits in the pages it attends to. For tests, the engine records which request owned
every word it quoted.
"""

from __future__ import annotations

import enum
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ENGINE_NAME = "bleedwatch-sim"
BUGGY_VERSION = "1.0.0"
FIXED_VERSION = "1.1.0"  # the first release with the isolation fix; rules.toml says so too
EMPTY = -1


class Mode(enum.StrEnum):
    BUGGY = "buggy"
    FIXED = "fixed"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """A deployment of the simulated engine. Defaults are the incident scaled down to words."""

    deployment: str = "sim-pd-1"
    model: str = "sim-open-weights-1m"
    mode: Mode = Mode.BUGGY
    context_length: int = 4_000
    prefill_pool_tokens: int = 2_000
    decode_pool_tokens: int = 4_000
    page_size: int = 16
    nodes: int = 1
    quote_words: int = 48
    quotes: int = 3
    gist_words: int = 20

    def __post_init__(self) -> None:
        if self.page_size < 1 or self.nodes < 1 or self.context_length < 1:
            raise ValueError("page_size, nodes and context_length must be at least 1")
        if min(self.prefill_pool_tokens, self.decode_pool_tokens) < self.page_size:
            raise ValueError("each KV pool must hold at least one page")

    @property
    def engine_version(self) -> str:
        return FIXED_VERSION if self.mode is Mode.FIXED else BUGGY_VERSION

    def node_names(self) -> list[str]:
        return [f"decode-{i}" for i in range(self.nodes)]

    def deployment_config(self) -> dict[str, Any]:
        """The body of ``PUT /v1/deployments/{id}``: what this build declares about itself.

        Only the over-pool refusal is simulated; the safeguard flags are what each build
        claims, as the provider's builds did before and after the incident.
        """
        fixed = self.mode is Mode.FIXED
        return {
            "model": self.model,
            "engine": ENGINE_NAME,
            "engine_version": self.engine_version,
            "disaggregated": True,
            "context_length": self.context_length,
            "prefill_kv_pool_tokens": _capacity(self.prefill_pool_tokens, self.page_size),
            "decode_kv_pool_tokens": _capacity(self.decode_pool_tokens, self.page_size),
            "safeguards": {
                "deferred_page_release_prefill": fixed,
                "deferred_page_release_decode": fixed,
                "kv_transfer_batch_cap": 64 if fixed else None,
                "lb_aborts_on_client_disconnect": not fixed,
            },
        }


def _capacity(tokens: int, page_size: int) -> int:
    return (tokens // page_size) * page_size


class Pool:
    """Fixed pages of token slots; a slot keeps its token and owner until overwritten."""

    def __init__(self, name: str, tokens: int, page_size: int) -> None:
        self.name = name
        self.page_size = page_size
        self.pages = tokens // page_size
        self.capacity = self.pages * page_size
        self._tokens: list[str | None] = [None] * self.capacity
        self._owners: list[int] = [EMPTY] * self.capacity
        # A stack: the page released last is handed out first, as allocators that favour
        # warm memory do; pop() yields page 0 first on a fresh pool.
        self._free: list[int] = list(range(self.pages - 1, -1, -1))

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def alloc(self, pages: int) -> list[int] | None:
        if pages > len(self._free):
            return None
        return [self._free.pop() for _ in range(pages)]

    def release(self, pages: list[int]) -> None:
        """Back to the free stack, in an order that hands them out again in the same order."""
        self._free.extend(reversed(pages))

    def _slot(self, pages: list[int], i: int) -> int:
        return pages[i // self.page_size] * self.page_size + i % self.page_size

    def write(self, pages: list[int], tokens: list[str], owner: int) -> None:
        for i, token in enumerate(tokens):
            slot = self._slot(pages, i)
            self._tokens[slot] = token
            self._owners[slot] = owner

    def read(self, pages: list[int], n: int) -> list[tuple[str | None, int]]:
        return [(self._tokens[s], self._owners[s]) for s in (self._slot(pages, i) for i in range(n))]


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    prefill: Pool
    decode: Pool


@dataclass(frozen=True, slots=True)
class Source:
    """An earlier request whose tokens an answer quoted verbatim."""

    tenant: str
    request_id: str
    words: int
    longest_run: int


@dataclass(frozen=True, slots=True)
class Served:
    request_id: str
    tenant: str
    node: str
    prompt_tokens: int
    answer: str
    completion_tokens: int
    finished_at: float
    stale: bool  # decoded over pages its prefill never wrote: the bug's path
    sources: tuple[Source, ...]  # every request quoted, this one included

    @property
    def leaked_from(self) -> tuple[Source, ...]:
        """Other tenants' requests whose text this answer carried: the leak, as the engine knows it."""
        return tuple(s for s in self.sources if s.tenant != self.tenant)


@dataclass(frozen=True, slots=True)
class Refused:
    status: int
    code: str
    message: str
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class Signal:
    """An integrity event the engine noticed itself (kinds as in ``POST /v1/signals``)."""

    kind: str
    deployment: str
    node: str
    request_id: str
    ts: float
    count: int = 1


@dataclass(slots=True)
class _Owner:
    request_id: str
    tenant: str


@dataclass(slots=True)
class History:
    served: list[Served] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)
    signals: list[Signal] = field(default_factory=list)

    def leaks(self) -> list[Served]:
        return [s for s in self.served if s.leaked_from]


class Engine:
    def __init__(self, config: EngineConfig, on_signal: Callable[[Signal], None] | None = None) -> None:
        self.config = config
        self.nodes = [
            Node(
                name,
                Pool(f"{name}/prefill", config.prefill_pool_tokens, config.page_size),
                Pool(f"{name}/decode", config.decode_pool_tokens, config.page_size),
            )
            for name in config.node_names()
        ]
        self.history = History()
        self._on_signal = on_signal
        self._owners: list[_Owner] = []
        self._next_node = 0
        self._run = secrets.token_hex(4)
        self._lock = threading.Lock()

    def serve(self, tenant: str, prompt: str, max_tokens: int | None = None) -> Served | Refused:
        tokens = prompt.split()
        with self._lock:
            result = self._serve(tenant, tokens, max_tokens)
        if isinstance(result, Served):
            self.history.served.append(result)
        else:
            self.history.refused.append(result)
        return result

    def _serve(self, tenant: str, tokens: list[str], max_tokens: int | None) -> Served | Refused:
        cfg = self.config
        n = len(tokens)
        if n == 0:
            return Refused(400, "invalid_request_error", "the messages hold no text", 0)
        if n > cfg.context_length:
            return Refused(
                400,
                "context_length_exceeded",
                f"this model's maximum context length is {cfg.context_length} tokens; the prompt has {n}",
                n,
            )
        node = self.nodes[self._next_node]
        self._next_node = (self._next_node + 1) % len(self.nodes)
        request_id = f"chatcmpl-{self._run}{len(self._owners):05d}"
        owner = len(self._owners)
        self._owners.append(_Owner(request_id, tenant))

        decode_pages = node.decode.alloc(node.decode.pages_for(n))
        if decode_pages is None:
            return Refused(503, "server_overloaded", "no free KV pages on the decode side; retry later", n)
        prefill_pages = node.prefill.alloc(node.prefill.pages_for(n))
        stale = False
        if prefill_pages is not None:
            node.prefill.write(prefill_pages, tokens, owner)
            node.decode.write(decode_pages, tokens, owner)  # the KV transfer
            node.prefill.release(prefill_pages)
        elif cfg.mode is Mode.FIXED:
            node.decode.release(decode_pages)
            return Refused(
                400,
                "context_length_exceeded",
                f"the prompt has {n} tokens, more than the prefill KV pool holds ({node.prefill.capacity})",
                n,
            )
        else:
            # The bug: prefill "rejects" the request by completing a 1-token placeholder
            # transfer; decode takes all its reserved pages as written.
            node.decode.write(decode_pages, tokens[:1], owner)
            stale = True
            self._signal(Signal("kv_transfer_short", cfg.deployment, node.name, request_id, time.time()))
        attended = node.decode.read(decode_pages, n)
        node.decode.release(decode_pages)
        words, quoted = answer(attended, cfg)
        if max_tokens is not None:
            words = words[:max_tokens]
        return Served(
            request_id=request_id,
            tenant=tenant,
            node=node.name,
            prompt_tokens=n,
            answer=" ".join(words),
            completion_tokens=len(words),
            finished_at=time.time(),
            stale=stale,
            sources=self._sources(quoted),
        )

    def _signal(self, signal: Signal) -> None:
        self.history.signals.append(signal)
        if self._on_signal is not None:
            self._on_signal(signal)

    def _sources(self, quoted: list[list[int]]) -> tuple[Source, ...]:
        words: dict[int, int] = {}
        longest: dict[int, int] = {}
        for quote in quoted:
            run_owner, run = EMPTY, 0
            for owner in quote:
                run = run + 1 if owner == run_owner else 1
                run_owner = owner
                words[owner] = words.get(owner, 0) + 1
                longest[owner] = max(longest.get(owner, 0), run)
        return tuple(
            Source(self._owners[o].tenant, self._owners[o].request_id, words[o], longest[o]) for o in sorted(words)
        )


def answer(attended: list[tuple[str | None, int]], cfg: EngineConfig) -> tuple[list[str], list[list[int]]]:
    """The model: words of the answer, and for each verbatim quote the owner of every word.

    Empty slots (never written since the pool started) carry nothing and are skipped. The
    paraphrase is taken from the start of the context, which the first quote also covers, so
    every request whose text shaped the answer is among the quotes' owners.
    """
    context = [(t, o) for t, o in attended if t is not None]
    if not context:
        return [], []
    head = context[: 2 * cfg.gist_words]
    words = [t for t, _ in head[::2]]
    span = min(cfg.quote_words, len(context))
    count = max(1, min(cfg.quotes, len(context) // span))
    starts = [0] if count == 1 else [i * (len(context) - span) // (count - 1) for i in range(count)]
    quoted: list[list[int]] = []
    for start in starts:
        piece = context[start : start + span]
        words.append("—")
        words.extend(t for t, _ in piece)
        quoted.append([o for _, o in piece])
    return words, quoted
