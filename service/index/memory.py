"""The in-process index of the embedded default: same contract as Redis, one process only."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from service import metrics
from service.index.base import (
    HELD_VALUE_BYTES,
    PROMPT_BIT,
    RESPONSE_BIT,
    SERVED_FIRST_BIT,
    YIELD_EVERY,
    Doc,
    DocMeta,
    Entry,
    Hit,
    Kind,
    Lookup,
    Outbox,
    Queue,
    same_exchange,
    sends,
)
from service.index.keys import DOC_REF_LIMIT, Keys
from service.index.outbox import MemoryOutbox
from service.index.queue import MemoryQueue
from service.index.window import Window


class _Held(dict[int, Entry]):
    """A value common only by holders: its senders' entries (in this generation), and the tenants
    served it, as many as lua/common.lua's marks fit in ``HELD_VALUE_BYTES``."""

    __slots__ = ("served",)

    def __init__(self, entries: dict[int, Entry], keep: int) -> None:
        """``keep``: the tenant whose doc is being inserted keeps its entry, which that doc folds into
        (lua/insert.lua's held_of)."""
        super().__init__((t, e) for t, e in entries.items() if sends(e.kinds) or t == keep)
        self.served = {t for t in entries if t not in self}

    def room_for(self, tenant: int) -> bool:
        """Whether a mark for ``tenant`` keeps the value within ``HELD_VALUE_BYTES`` as Redis stores it."""
        entries = sum(_varint_len(e.tenant * 8 + e.kinds) + 4 + _varint_len(e.offset) for e in self.values())
        marks = sum(_varint_len(t * 8 + _MARK) for t in self.served | {tenant})
        return 1 + entries + marks <= HELD_VALUE_BYTES


_MARK = 6  # a mark's kinds in Redis' encoding (lua/common.lua's MARK), for its size

# A generation's fingerprint table: value -> entries by tenant; _Held once common by holders with
# fewer than common_prompt_tenants senders; None once common by senders (lua/common.lua's '*').
_Table = dict[int, dict[int, Entry] | None]
_ABSENT: dict[int, Entry] = {}  # a sentinel: not in the table


class MemoryIndex:
    def __init__(self, window: Window, common_prompt_tenants: int, common_tenants: int) -> None:
        self._window = window
        self._common_prompt = common_prompt_tenants
        self._common_any = common_tenants
        self._tables: dict[tuple[str, int], _Table] = {}
        self._docs: dict[tuple[str, int], tuple[int, DocMeta]] = {}
        self._done: dict[str, int] = {}
        self._tenants: dict[str, int] = {}
        self._tenant_seq = itertools.count(1)  # never reused, also after a purge
        self._purged: dict[str, float] = {}  # tombstones: tenant digest -> purge time
        # API key id -> (minute, new tenant names it sent then); one entry per key, at most the limit names.
        self._new_tenants: dict[str, tuple[int, set[str]]] = {}
        self._doc_seq = itertools.count(1)
        self._outbox: Outbox | None = None
        self._queue: Queue | None = None

    def outbox(self) -> Outbox:
        if self._outbox is None:
            self._outbox = MemoryOutbox()
        return self._outbox

    def queue(self) -> Queue:
        if self._queue is None:
            self._queue = MemoryQueue()
        return self._queue

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def tenant_refs(self, names: list[str]) -> dict[str, int]:
        for name in names:
            if name not in self._tenants:
                self._tenants[name] = next(self._tenant_seq)
        return {name: self._tenants[name] for name in names}

    async def admit_new_tenants(self, key_id: str, names: list[str], limit: int, now: float) -> set[str]:
        minute = int(now // 60)
        at, seen = self._new_tenants.get(key_id, (minute, set()))
        if at != minute:
            seen = set()
        self._new_tenants[key_id] = (minute, seen)
        refused = set()
        for name in sorted(set(names)):
            if name in self._tenants or name in seen:
                continue
            if len(seen) < limit:
                seen.add(name)
            else:
                refused.add(name)
        return refused

    async def new_doc_refs(self, count: int) -> int:
        if not 0 < count < DOC_REF_LIMIT // 2:
            raise ValueError("count must be positive and well below 2^31")
        first = next(self._doc_seq)
        if first + count > DOC_REF_LIMIT:  # wraps as the Redis counter does (keys.DOC_REF_LIMIT)
            self._doc_seq = itertools.count(1)
            first = next(self._doc_seq)
        for _ in range(count - 1):
            next(self._doc_seq)
        return first

    async def put_docs(self, key_id: str, docs: dict[int, DocMeta], now: float) -> set[int]:
        self._expire(now)
        gen = self._window.current(now)
        taken = set()
        for ref, meta in docs.items():
            held = self._docs.get((key_id, ref))
            if held is not None and not same_exchange(held[1], meta):
                taken.add(ref)
                continue
            self._docs[(key_id, ref)] = (gen, meta)
        return taken

    async def get_docs(self, key_id: str, refs: list[int], now: float) -> dict[int, DocMeta]:
        self._expire(now)
        return {ref: self._docs[(key_id, ref)][1] for ref in refs if (key_id, ref) in self._docs}

    def _merged(self, key_id: str, value: int, gens: Iterable[int]) -> tuple[dict[int, Entry] | None, bool, set[int]]:
        """Entries over the live generations, oldest first (a held generation gives its senders'),
        whether it is common by holders, and the tenants a held generation marks as served it, which
        are no senders; None when a generation has it common by senders."""
        merged: dict[int, Entry] = {}
        served: set[int] = set()
        held = False
        for gen in gens:
            table = self._tables.get((key_id, gen))
            if table is None:
                continue
            entries = table.get(value, _ABSENT)
            if entries is None:
                return None, True, served
            if entries is _ABSENT:
                continue
            if isinstance(entries, _Held):
                held = True
                served |= entries.served
            for tenant, entry in entries.items():
                old = merged.get(tenant)
                merged[tenant] = entry if old is None else _fold(old, entry.doc, entry.offset, entry.kinds)
        return merged, held or len(merged) >= self._common_any, served

    async def insert(self, key_id: str, docs: list[Doc], now: float) -> list[Hit]:
        self._expire(now)
        gens = self._window.live(now)
        current = self._tables.setdefault((key_id, self._window.current(now)), {})
        counts: dict[tuple[int, int, int, int], int] = {}
        if any(not 0 <= d.ref < DOC_REF_LIMIT or not 0 <= d.tenant < DOC_REF_LIMIT for d in docs):
            raise ValueError("doc and tenant refs are stored as u32: use new_doc_refs and tenant_refs")
        since_yield = 0
        for pos, doc in enumerate(docs):
            kind = int(doc.kind)
            for value, offset in zip(doc.values.tolist(), doc.offsets.tolist(), strict=True):
                since_yield += 1
                if since_yield == YIELD_EVERY:  # one text may hold 500,000
                    since_yield = 0
                    await asyncio.sleep(0)
                merged, held, served = self._merged(key_id, value, gens)
                if merged is None:
                    current[value] = None
                    continue
                mine = merged.get(doc.tenant)
                senders = _senders(merged.values(), served)
                if not held and senders < self._common_prompt:
                    for tenant, other in merged.items():
                        if tenant != doc.tenant and _counts(kind, doc.ref, mine, other):
                            key = (pos, tenant, other.doc, other.kinds)
                            counts[key] = counts.get(key, 0) + 1
                new = Entry(doc.tenant, doc.ref, offset, kind)
                folded = new if mine is None else _fold(mine, doc.ref, offset, kind)
                # Its tenant a sender with this doc: not if served it while it was held.
                sender = sends(folded.kinds) and doc.tenant not in served
                was = mine is not None and sends(mine.kinds) and doc.tenant not in served
                if senders + sender - was >= self._common_prompt:
                    current[value] = None
                    continue
                stored = current.get(value)  # not None: _merged would have said common
                entries: dict[int, Entry] = {} if stored is None else stored
                if (held or len(merged) + (mine is None) >= self._common_any) and not isinstance(entries, _Held):
                    # Held in this generation too, so that it stays common after the ones that made it so
                    # expire (as None does).
                    entries = _Held(entries, keep=doc.tenant)
                current[value] = entries
                old = entries.get(doc.tenant)
                if old is not None:
                    entries[doc.tenant] = _fold(old, doc.ref, offset, kind)
                elif not isinstance(entries, _Held) or (sender and kind & PROMPT_BIT):
                    entries[doc.tenant] = new
                elif not sender and doc.tenant not in served and entries.room_for(doc.tenant):
                    entries.served.add(doc.tenant)
        return [Hit(pos, tenant, ref, Kind(kinds), count) for (pos, tenant, ref, kinds), count in counts.items()]

    async def lookup(self, key_id: str, values: npt.NDArray[np.uint64], now: float) -> list[Lookup]:
        gens = self._window.live(now)
        out = []
        for i, value in enumerate(values.tolist()):
            if i and i % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            merged, held, served = self._merged(key_id, value, gens)
            if merged is None or _senders(merged.values(), served) >= self._common_prompt:
                out.append(Lookup(None))
            elif held:
                out.append(Lookup(None, tuple(e for e in merged.values() if sends(e.kinds) and e.tenant not in served)))
            else:
                out.append(Lookup(tuple(merged.values())))
        return out

    async def done(self, keys: list[str], now: float) -> list[bool]:
        self._expire(now)
        return [key in self._done for key in keys]

    async def mark_done(self, keys: list[str], now: float) -> None:
        gen = self._window.current(now)
        for key in keys:
            self._done[key] = gen

    async def purged(self, names: list[str]) -> dict[str, float]:
        found = {name: self._purged.get(Keys.tenant_digest(name)) for name in names}
        return {name: at for name, at in found.items() if at is not None}

    async def purge_tenant(self, name: str, now: float) -> int:
        self._purged[Keys.tenant_digest(name)] = now
        self._tenants.pop(name, None)
        gone = [key for key, (_, meta) in self._docs.items() if meta.tenant == name]
        for key in gone:
            del self._docs[key]
        return len(gone)

    async def stats(self) -> metrics.IndexStats:
        """For /metrics: entries held, and a rough memory estimate (CPython object sizes, not measured)."""
        fingerprints = sum(len(table) for table in self._tables.values())
        arrays = sum(
            (m.values.nbytes if m.values is not None else 0) + (m.offsets.nbytes if m.offsets is not None else 0)
            for _, m in self._docs.values()
        )
        items = fingerprints + len(self._docs) + len(self._done)
        return metrics.IndexStats(items, 350 * fingerprints + 600 * len(self._docs) + arrays + 150 * len(self._done))

    def _expire(self, now: float) -> None:
        oldest = self._window.live(now).start
        for key in [k for k in self._tables if k[1] < oldest]:
            del self._tables[key]
        for doc_key in [k for k, (gen, _) in self._docs.items() if gen < oldest]:
            del self._docs[doc_key]
        for done_key in [k for k, gen in self._done.items() if gen < oldest]:
            del self._done[done_key]


def _varint_len(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def _senders(entries: Iterable[Entry], served: set[int]) -> int:
    return sum(sends(e.kinds) and e.tenant not in served for e in entries)


def _fold(entry: Entry, doc: int, offset: int, kinds: int) -> Entry:
    """Kinds add up; the doc is the tenant's first holding the text, the lowest ref, not the first to
    arrive, so the order batches are processed in (which a Redis Cluster's nodes each see differently)
    changes nothing (common.lua). A prompt after an answer holding it is a resend: ``SERVED_FIRST_BIT``."""
    if doc < entry.doc:
        first_doc, first_offset, first_kinds = doc, offset, kinds
    else:
        first_doc, first_offset, first_kinds = entry.doc, entry.offset, entry.kinds
    bits = (entry.kinds | kinds) & (PROMPT_BIT | RESPONSE_BIT)
    if bits & PROMPT_BIT and not sends(first_kinds):
        bits |= SERVED_FIRST_BIT
    return Entry(entry.tenant, first_doc, first_offset, bits)


def _counts(kind: int, ref: int, mine: Entry | None, other: Entry) -> bool:
    """Whether a shared fingerprint may be evidence of a leak, in one direction or the other.

    An incoming response may have leaked from anything another tenant sent or received, unless
    the recipient has the text in a prompt of its own before it; an incoming prompt may be the
    source of another tenant's answer (an answer it was served first) only if it is now its
    tenant's first document holding the text: a prompt after one that sent it was judged with it
    already, and one after an answer that served it resends what the tenant was told. Which side
    of a response pair leaked is for the matcher to judge.
    """
    if kind & RESPONSE_BIT:  # its recipient's prompt may have been processed first: a later ref
        return mine is None or not mine.kinds & PROMPT_BIT or ref < mine.doc
    return not sends(other.kinds) and (mine is None or ref < mine.doc)
