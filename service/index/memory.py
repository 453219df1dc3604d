"""The in-process index of the embedded default: same contract as Redis, one process only."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from service.index.base import Doc, DocMeta, Entry, Hit, Kind, Lookup
from service.index.window import Window

# A generation's fingerprint table: value -> entries by tenant, or None once common.
_Table = dict[int, dict[int, Entry] | None]


class MemoryIndex:
    def __init__(self, window: Window, common_tenants: int) -> None:
        self._window = window
        self._common = common_tenants
        self._tables: dict[tuple[str, int], _Table] = {}
        self._docs: dict[tuple[str, int], tuple[int, DocMeta]] = {}
        self._done: dict[str, int] = {}
        self._tenants: dict[str, int] = {}
        self._doc_seq = itertools.count(1)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def tenant_refs(self, names: list[str]) -> dict[str, int]:
        for name in names:
            self._tenants.setdefault(name, len(self._tenants) + 1)
        return {name: self._tenants[name] for name in names}

    async def new_doc_refs(self, count: int) -> int:
        first = next(self._doc_seq)
        for _ in range(count - 1):
            next(self._doc_seq)
        return first

    async def put_docs(self, ns: str, docs: dict[int, DocMeta], now: float) -> None:
        gen = self._window.current(now)
        for ref, meta in docs.items():
            self._docs[(ns, ref)] = (gen, meta)
        self._expire(now)

    async def get_docs(self, ns: str, refs: list[int], now: float) -> dict[int, DocMeta]:
        self._expire(now)
        return {ref: self._docs[(ns, ref)][1] for ref in refs if (ns, ref) in self._docs}

    def _merged(self, ns: str, value: int, gens: Iterable[int]) -> dict[int, Entry] | None:
        merged: dict[int, Entry] = {}
        for gen in gens:
            table = self._tables.get((ns, gen))
            if table is None or value not in table:
                continue
            entries = table[value]
            if entries is None:
                return None
            for tenant, entry in entries.items():
                old = merged.get(tenant)
                merged[tenant] = entry if old is None else Entry(tenant, old.doc, old.offset, old.kinds | entry.kinds)
        return None if len(merged) >= self._common else merged

    async def insert(self, ns: str, docs: list[Doc], now: float) -> list[Hit]:
        self._expire(now)
        gens = self._window.live(now)
        current = self._tables.setdefault((ns, self._window.current(now)), {})
        counts: dict[tuple[int, int, int, Kind], int] = {}
        for pos, doc in enumerate(docs):
            for value, offset in zip(doc.values.tolist(), doc.offsets.tolist(), strict=True):
                merged = self._merged(ns, value, gens)
                if merged is None:
                    current[value] = None
                    continue
                mine = merged.get(doc.tenant)
                for tenant, other in merged.items():
                    if tenant != doc.tenant and _counts(doc, mine, other):
                        key = (pos, tenant, other.doc, other.kinds)
                        counts[key] = counts.get(key, 0) + 1
                entries = current.get(value) or {}
                if doc.tenant not in merged and len(merged) + 1 >= self._common:
                    current[value] = None
                    continue
                old = entries.get(doc.tenant)
                entries[doc.tenant] = (
                    Entry(doc.tenant, doc.ref, offset, doc.kind)
                    if old is None
                    else Entry(doc.tenant, old.doc, old.offset, old.kinds | doc.kind)
                )
                current[value] = entries
        return [Hit(*key, count) for key, count in counts.items()]

    async def lookup(self, ns: str, values: npt.NDArray[np.uint64], now: float) -> list[Lookup]:
        gens = self._window.live(now)
        out = []
        for value in values.tolist():
            merged = self._merged(ns, value, gens)
            out.append(Lookup(None if merged is None else tuple(merged.values())))
        return out

    async def done(self, keys: list[str], now: float) -> list[bool]:
        self._expire(now)
        return [key in self._done for key in keys]

    async def mark_done(self, keys: list[str], now: float) -> None:
        gen = self._window.current(now)
        for key in keys:
            self._done[key] = gen

    def _expire(self, now: float) -> None:
        oldest = self._window.live(now).start
        for key in [k for k in self._tables if k[1] < oldest]:
            del self._tables[key]
        for doc_key in [k for k, (gen, _) in self._docs.items() if gen < oldest]:
            del self._docs[doc_key]
        for done_key in [k for k, gen in self._done.items() if gen < oldest]:
            del self._done[done_key]


def _counts(doc: Doc, mine: Entry | None, other: Entry) -> bool:
    """Whether a shared fingerprint is evidence of a leak, in one direction or the other.

    Leaks go from a prompt to another tenant's response: either the incoming doc is a response
    and the other tenant had the text in a prompt (and the recipient never did), or the
    incoming doc is a prompt and the other tenant had the text in responses only.
    """
    if doc.kind & Kind.RESPONSE:
        return bool(other.kinds & Kind.PROMPT) and not (mine and mine.kinds & Kind.PROMPT)
    return other.kinds == Kind.RESPONSE
