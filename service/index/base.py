"""The index contract: what the matcher needs from a store of recent fingerprints.

Two backends implement it, Redis (``redis_index.py``) for deployments and an in-process one
(``memory.py``) for the embedded default; ``tests/test_index_contract.py`` holds both to it.

Per fingerprint the index keeps, within the retention window, one entry per tenant that used
it: the tenant, its first document holding it (the lowest ref, whatever order they arrived in)
and the fingerprint's token offset there, whether the tenant had it in a prompt, a response or
both, and, where both, whether it was served the text before it sent it (``SERVED_FIRST_BIT``: a
chat sends its history, a leaked answer included, in its next turn). A fingerprint becomes
*common* (shared boilerplate) and its entries are dropped once ``common_prompt_tenants`` tenants
sent it before being served it, or ``common_tenants`` tenants had it at all: only senders count
towards the first, so one tenant's text leaking into several answers, and resent by their chats,
keeps being evidence. Common only by holders, it keeps its senders' entries (fewer than
``common_prompt_tenants``: bounded) and which tenants were served it, while that fits in
``HELD_VALUE_BYTES``: a later judgment of a finding can then tell one tenant's prompt leaked into
many answers, which the leak itself makes common, from text that has become public.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from bleedwatch.fingerprint.scheme import Params


class Kind(enum.IntFlag):
    PROMPT = 1
    RESPONSE = 2


def same_exchange(a: DocMeta, b: DocMeta) -> bool:
    """Whether two documents are the same text of the same exchange (a batch processed again)."""
    return (a.tenant, a.request_id, a.kind) == (b.tenant, b.request_id, b.kind)


def kind_name(kind: Kind) -> str:
    return "response" if kind & Kind.RESPONSE else "prompt"


@dataclass(frozen=True, slots=True)
class Doc:
    """One text of one exchange, as indexed: refs instead of names, fingerprints as arrays."""

    ref: int
    tenant: int
    kind: Kind
    values: npt.NDArray[np.uint64]
    offsets: npt.NDArray[np.uint32]


class Entry(NamedTuple):
    """A tuple, not a dataclass: lookups build one per matched fingerprint and tenant."""

    tenant: int
    doc: int
    offset: int
    kinds: int  # Kind bits as a plain int: IntFlag arithmetic costs a Python call per operation


PROMPT_BIT = int(Kind.PROMPT)
RESPONSE_BIT = int(Kind.RESPONSE)
# An entry's kinds flag: the tenant has the text in a prompt, but its first document holding it is
# an answer: it was served the text before it sent it, so it is no sender of it (``sends``).
SERVED_FIRST_BIT = 4
# A value common only by holders remembers the tenants served it (a mark of 1 to 4 bytes each) while it
# stays this long, so that the recipients of one prompt leaked into many answers are no senders when
# their chats send it back: bounded however many tenants the model says a stock answer to, and no
# longer than Redis' hash-max-listpack-value, past which a whole bucket loses its compact encoding.
HELD_VALUE_BYTES = 64


def sends(kinds: int) -> bool:
    """Whether an entry's tenant sent the text before it was served it: its first document is a prompt."""
    return kinds & (PROMPT_BIT | SERVED_FIRST_BIT) == PROMPT_BIT


# Python loops over fingerprints on the event loop (the embedded index's inserts and lookups, Redis
# lookup rows turned into entries) let it answer health checks and other requests every this many.
# Another batch's work may run in between, as it may between Redis' calls.
YIELD_EVERY = 5_000


@dataclass(frozen=True, slots=True)
class Hit:
    """The ``batch_pos``-th incoming doc shares ``count`` fingerprints with entries of another
    tenant whose first doc is ``doc``.

    Only what may be a leak counts: an incoming response against anything the other tenant
    sent or received, or an incoming prompt against the other tenant's responses, leaving out
    fingerprints that are common or that the would-be recipient has in a prompt of its own.
    """

    batch_pos: int
    tenant: int
    doc: int
    kinds: Kind
    count: int


class Lookup(NamedTuple):
    """What the index holds for one fingerprint: ``None`` entries means common.

    ``senders`` is a tuple only when entries is None because ``common_tenants`` tenants hold it
    while fewer than ``common_prompt_tenants`` sent it: the entries of those that sent it (``sends``),
    merged over the live generations; ``()`` when none sent it (the model's own text, or a leaked
    answer's). Common by senders (``common_prompt_tenants`` of them over those generations), or not
    common, it is None. The first judgment reads ``entries`` only; a later one, before a finding is
    raised, needs the senders to see that a leak of one tenant's prompt into many answers, which
    made it common, is still that tenant's text.
    """

    entries: tuple[Entry, ...] | None
    senders: tuple[Entry, ...] | None = None


@dataclass(frozen=True, slots=True)
class DocMeta:
    """What the matcher needs to report a document without ever holding its text."""

    tenant: str
    request_id: str
    kind: Kind
    model: str
    ts: float
    token_count: int
    context: dict[str, str | int | float | bool | None]
    params: Params
    # Kept for responses only, so a late-arriving source can re-check an earlier response.
    values: npt.NDArray[np.uint64] | None = None
    offsets: npt.NDArray[np.uint32] | None = None


# What a purge does to an item of the queue or the outbox: the same bytes (kept), others, or None (deleted).
Rewrite = Callable[[bytes], bytes | None]


class Outbox(Protocol):
    """Findings held while the database is unreachable, until a replica writes them.

    Durable where the index is (a Redis Stream; in process for the embedded default). An item is
    ``claim``-ed by one replica at a time and ``release``-d once written; an item claimed by a
    replica that died is claimed again by another after ``min_idle_seconds``. Writing an item
    twice is harmless: findings are upserts. service/findings/writer.py drives it.
    """

    async def hold(self, items: list[bytes]) -> None: ...

    async def hold_until(self, items: list[bytes], due: float) -> None:
        """Keep ``items`` aside until ``due`` (epoch seconds): findings on hold, judged again once due."""
        ...

    async def move_due(self, now: float, count: int) -> int:
        """Up to ``count`` items whose ``due`` has come, into the outbox, where they are claimed as any
        other; how many. Each moves once, whichever replica asks."""
        ...

    async def later_size(self) -> int: ...

    async def claim(self, consumer: str, count: int, min_idle_seconds: float) -> list[tuple[str, bytes]]:
        """Up to ``count`` items: this consumer's own unreleased ones first, then abandoned, then new."""
        ...

    async def release(self, ids: list[str]) -> None: ...

    async def bury(self, item_id: str, item: bytes, reason: str) -> None:
        """Move a claimed item aside, to the dead letters, with its reason: it failed to be written
        too often, and left first in line it would hold back every finding behind it."""
        ...

    async def size(self) -> int: ...

    async def dead_size(self) -> int: ...

    async def expire_dead(self, before: float) -> int:
        """Delete dead letters buried before ``before`` (epoch seconds); how many. Dead letters are
        kept for an operator to requeue once the bug is fixed, not forever: a steady stream of
        poison batches would otherwise grow Redis without bound."""
        ...

    async def requeue_dead(self, count: int) -> int:
        """Put up to ``count`` dead letters back to be written, oldest first; how many."""
        ...

    async def rewrite(self, keep: Rewrite) -> int:
        """Pass every item, dead letters and items on hold included, through ``keep``: None deletes it, other bytes
        replace it (a tenant purge); how many items changed. An item being written meanwhile is
        written as it was, which the writer's tombstone check (service/findings/writer.py) makes harmless."""
        ...


class Queue(Protocol):
    """Accepted ingest batches, until a replica has indexed and matched them.

    Durable where the index is (a Redis Stream), so a batch answered 202 is never lost: one
    replica ``take``-s it, and ``finish``-es it with its result once processed; a batch taken by
    a replica that died is ``reclaim``-ed by another after ``min_idle_seconds``, with its count of
    deliveries, and a batch that keeps failing is ``bury``-ed where an operator can see it. A
    replica still at a batch ``hold``-s it, so a slow batch is not mistaken for an abandoned one.
    Processing twice is harmless (service/ingest/service.py). service/ingest/worker.py drives it.
    """

    durable: bool

    async def put(self, item: bytes, max_items: int, max_bytes: int = 0) -> str | None:
        """The new item's id, or None when ``max_items`` are already waiting, or when the items waiting
        and this one would pass ``max_bytes`` (0: no byte bound; into an empty queue any item goes, so a
        batch larger than the bound is still taken, alone)."""
        ...

    async def byte_size(self) -> int:
        """Bytes of the items waiting (taken but unfinished ones included; dead letters not)."""
        ...

    async def take(self, consumer: str, block_seconds: float, lane: int = 0) -> tuple[str, bytes] | None:
        """The next new item for ``consumer``, waiting up to ``block_seconds``; ``lane`` (a worker task's
        number) spreads a process's tasks over the shards of a sharded queue."""
        ...

    async def reclaim(self, consumer: str, min_idle_seconds: float, count: int) -> list[tuple[str, bytes, int]]: ...

    async def hold(self, consumer: str, item_id: str) -> bool:
        """``consumer`` is still at ``item_id``: its idle time starts again, and ``reclaim`` leaves it.
        False once another consumer has reclaimed it (both then process it, which is harmless)."""
        ...

    async def finish(self, item_id: str, result: bytes) -> None: ...

    async def bury(self, item_id: str, item: bytes, reason: str) -> None:
        """Move ``item`` to the dead letters with why it failed (an exception's type and message, no data)."""
        ...

    async def result(self, item_id: str) -> bytes | None:
        """What ``finish`` recorded, for a few minutes; None before."""
        ...

    async def size(self) -> int: ...

    async def dead_size(self) -> int: ...

    async def expire_dead(self, before: float) -> int:
        """Delete dead letters buried before ``before`` (epoch seconds); how many. Kept for an
        operator to requeue once the bug is fixed, not forever: a steady stream of poison batches
        would otherwise grow Redis without bound."""
        ...

    async def requeue_dead(self, count: int) -> int:
        """Put up to ``count`` buried items back in the queue (once the bug is fixed); how many."""
        ...

    async def rewrite(self, keep: Rewrite) -> int:
        """Pass every waiting and dead item through ``keep`` (a tenant purge); how many changed. A
        changed item is queued anew and the old one deleted: one a worker holds meanwhile is
        processed as it was, which the ingestor's tombstone check makes harmless."""
        ...


class Index(Protocol):
    """Every method is one bounded batch of work, never a round trip per fingerprint."""

    def outbox(self) -> Outbox:
        """Where findings wait while the database is down (same backend as the index)."""
        ...

    def queue(self) -> Queue:
        """Where accepted batches wait to be processed (same backend as the index)."""
        ...

    async def ping(self) -> None: ...

    async def close(self) -> None: ...

    async def tenant_refs(self, names: list[str]) -> dict[str, int]:
        """Small integer ids for tenant names, created on first use, stable forever."""
        ...

    async def admit_new_tenants(self, key_id: str, names: list[str], limit: int, now: float) -> set[str]:
        """Which of ``names`` to refuse: tenants not yet known, past the ``limit`` new ones that API key
        ``key_id`` may introduce in the clock minute of ``now``.

        Every tenant name becomes a stored ref, a cache entry and index entries that stay until it is
        purged: without this a caller with an ingest key could grow them without end by inventing names.
        Known tenants are never refused, and a new name counts once per minute however often it is sent.
        """
        ...

    async def new_doc_refs(self, count: int) -> int:
        """The first of ``count`` fresh, never reused document refs."""
        ...

    async def put_docs(self, key_id: str, docs: dict[int, DocMeta], now: float) -> set[int]:
        """Store each document under its ref, unless the ref holds another exchange's document.

        Returns those refs, left as they were. A ref is handed out twice only when Redis lost the
        last writes to its counter (a power loss with ``appendfsync everysec``) while a worker held a
        batch accepted just before: the caller takes new refs for those exchanges, so neither batch's
        documents replace the other's (bench/RESULTS.md, 2026-12-05, the fault drill).
        """
        ...

    async def get_docs(self, key_id: str, refs: list[int], now: float) -> dict[int, DocMeta]:
        """Metadata of documents still within the retention window; missing ones are left out."""
        ...

    async def insert(self, key_id: str, docs: list[Doc], now: float) -> list[Hit]:
        """Index ``docs`` in order and report what each shares with other tenants' entries.

        Docs are inserted one after the other, so a batch that holds both sides of a leak
        reports it, and so does a batch whose other side was indexed earlier by anyone.
        """
        ...

    async def lookup(self, key_id: str, values: npt.NDArray[np.uint64], now: float) -> list[Lookup]:
        """Read-only view of ``values``, one ``Lookup`` per value in order."""
        ...

    async def done(self, keys: list[str], now: float) -> list[bool]:
        """For idempotency: which of ``keys`` were marked done within the window."""
        ...

    async def mark_done(self, keys: list[str], now: float) -> None: ...

    async def purged(self, names: list[str]) -> dict[str, float]:
        """When each of ``names`` that was purged was purged (epoch seconds); the others are left out.

        Work about anything at or before that moment is refused (its exchanges, its findings): it
        was accepted, queued or held before the purge and would bring the tenant's data back.
        """
        ...

    async def purge_tenant(self, name: str, now: float) -> int:
        """Tombstone the tenant (``purged``), forget its name, delete its documents' metadata; how
        many documents. Its fingerprints' entries, kept senders included, stay until they expire (the
        index cannot be searched by tenant), but without their documents they can no longer make or explain a
        finding."""
        ...
