"""From matched fingerprints to evidence a responder can act on: exact pieces, copies, severity.

A leak copies a stretch of another tenant's text, perhaps cut into fragments with the
recipient's own words between them, or with a word changed here and there. Evidence is built
in two steps, each with one reason (docs/detection.md):

1. **Pieces.** Matches of one source document on one diagonal (source offset minus response
   offset) with no *hole* between them. A hole is a fingerprint the source would have kept had
   the text been the same there (the response re-winnowed with the source's window: ``kept``)
   that is neither the source tenant's nor blind (common, allowlisted, the recipient's own). A
   piece is thus an exact copy, as far as fingerprints can tell. Pieces of other documents of
   the tenant overlapping by a shingle are one text (``_one_text``): the index names the
   tenant's first document per fingerprint, so a text it holds twice (a prompt and the answer
   that echoed it) splits between them.
2. **Copies.** Pieces chained in response order while each continues the source where the
   last one stopped (``_joins``).

A copy scores the tokens its matches vouch for, less what chance explains: n - 1 tokens per
piece, since unrelated texts of one genre share short phrases (a piece of one shingle is n
tokens and scores 1), and ``JOIN_TOKENS`` per join, one more place chance may have lined pieces
up (a string of single shingles then adds nothing). One threshold on that score,
``Thresholds.min_score``, makes a finding, where the copy has a stretch somewhere (``is_finding``).

Cost: one sort of the matches, one binary search per match, and at most ``MAX_PREDECESSORS``
join checks per piece, so a response costs O(m log m) for m matches whatever their order. Those
steps are numpy passes over all the matches or pieces at once; Python steps are one per piece and
one per pair of pieces that join, since a response may make each of its matches a piece (one
value repeated 100,000 times: a model stuck in a loop, or a hostile sender).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from bleedwatch.fingerprint.scheme import Params, winnow
from service.findings.severity import Severity

# A piece ends where the next match of its diagonal is further than this (times ``sample_mod``
# where the source was sampled) even without a hole: between them the response is all blind.
GAP_TOKENS = 64
# Pieces a piece may continue are looked for among this many before it in response order: the
# budget that keeps chaining linear when a hostile response matches everywhere.
MAX_PREDECESSORS = 16
# What joining two pieces into one copy costs in score (module docstring).
JOIN_TOKENS = 1
# A stretch: a piece (an exact copy, as far as fingerprints tell) vouching for this many tokens, the
# length the issue of record calls a copy, which unrelated documents of one genre do not share. A
# copy needs one (is_finding), and a stretch two tenants each sent is shared text (matcher._evidence).
STRETCH_TOKENS = 8


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_matched: int  # fingerprints a copy needs
    min_score: int  # copied tokens a copy needs beyond what chance explains (module docstring)
    high_run_tokens: int
    critical_run_tokens: int


@dataclass(frozen=True, slots=True)
class Match:
    """One recipient fingerprint found in a source document."""

    response_offset: int
    source_doc: int
    source_offset: int


@dataclass(frozen=True, slots=True)
class Piece:
    """Tokens ``[start, end)`` of the response copy ``[source_start, source_end)`` of one source doc.

    ``copied``: the tokens its matches vouch for, at most ``end - start``. Between two matches
    further apart than the source keeps fingerprints, the response is blind (common text, say),
    and no evidence of copying: only the next shingle's tokens count.

    ``own``: where the piece is one of a text the tenant holds in several documents (``_one_text``), the
    piece as its own document shows it; this one then spans the text, its source offsets carried
    along its diagonal, and ``copied`` is what any of the text's pieces vouches for. Reports say ``own``.
    """

    start: int
    end: int
    source_doc: int
    source_start: int
    source_end: int
    fingerprints: int
    copied: int
    own: Piece | None = None

    @property
    def tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Copy:
    """Pieces chained into one copy: its last piece and the copy it continues, so that extending a
    copy costs the same however long it is."""

    last: Piece
    before: Copy | None
    score: int
    tokens: int  # response tokens its pieces cover, overlaps counted once
    fingerprints: int
    stretch: bool  # one of its pieces is a stretch (is_finding), kept here so no one walks the chain for it

    @classmethod
    def of(cls, piece: Piece, n: int) -> Copy:
        stretch = piece.copied >= STRETCH_TOKENS
        return cls(piece, None, piece.copied - (n - 1), piece.copied, piece.fingerprints, stretch)

    def then(self, piece: Piece, n: int) -> Copy:
        new = piece.copied - max(0, self.last.end - piece.start)  # what overlaps the last piece counted once
        score = self.score + new - (n - 1) - JOIN_TOKENS
        stretch = self.stretch or piece.copied >= STRETCH_TOKENS
        return Copy(piece, self, score, self.tokens + new, self.fingerprints + piece.fingerprints, stretch)

    @property
    def pieces(self) -> tuple[Piece, ...]:
        """Its pieces in response order: a walk of the whole chain (``every_piece`` for many copies)."""
        out = []
        at: Copy | None = self
        while at is not None:
            out.append(at.last)
            at = at.before
        return tuple(reversed(out))


def every_piece(copied: list[Copy]) -> list[Piece]:
    """The pieces of all ``copied``, each once. Copies share the chains they continue, and a hostile
    response can make many copies of long chains: each chain is walked only up to where another
    copy's walk went, so this costs one step per piece, not per piece of each copy."""
    seen: set[int] = set()
    out: list[Piece] = []
    for c in copied:
        at: Copy | None = c
        while at is not None and id(at) not in seen:
            seen.add(id(at))
            out.append(at.last)
            at = at.before
    return out


@dataclass
class Budget:
    """How far back a piece looks for a copy to continue; ``checks`` counts the looks, ``cut`` the
    searches the budget ended early (a metric)."""

    predecessors: int = MAX_PREDECESSORS
    checks: int = 0
    cut: int = 0


@dataclass(slots=True)
class Response:
    """The recipient's response as evidence sees it: fingerprints by offset, which are blind, its parameters.

    ``blind``: fingerprints that can be nobody's evidence and no source's hole (common,
    allowlisted, the recipient's own text). ``unsure``: the blind ones whose tokens are no known
    text, so they explain none (``blind_within``).
    """

    values: npt.NDArray[np.uint64]
    offsets: npt.NDArray[np.uint32]
    blind: npt.NDArray[np.bool_]
    params: Params
    unsure: npt.NDArray[np.bool_] | None = None
    _kept: dict[tuple[int, int], npt.NDArray[np.bool_]] = field(default_factory=dict, repr=False)
    _explained: Explained | None = field(default=None, repr=False)

    def free(self, lo: npt.ArrayLike, hi: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """How many of tokens ``[lo, hi)`` lie in no blind shingle: what a copy there can claim (per pair
        of ``lo`` and ``hi``, which are arrays or numbers alike).

        A shingle that is common, allowlisted or the recipient's own explains its tokens, so the
        shingles around it, which share them, vouch only for the rest. Computed on the blind
        shingles' merged spans, so it costs their number, not the offsets' size (a response may
        claim any offset up to 2**32 - 1).
        """
        if self._explained is None:
            explaining = self.blind if self.unsure is None else self.blind & ~self.unsure
            self._explained = _prefix_lengths(spans_of(self.offsets[explaining].astype(np.int64), self.params.n))
        low, high = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        out: npt.NDArray[np.int64] = (high - low) - (
            _covered_below(self._explained, high) - _covered_below(self._explained, low)
        )
        return out

    def kept(self, w: int, mod: int) -> npt.NDArray[np.bool_]:
        """Which fingerprints a source winnowed with ``w`` and sampled by ``mod`` would hold, had it the same text.

        With every shingle (``params.w == 1``) the response can be winnowed again with the
        source's window: inside a copy, away from its ends by less than a window, that picks
        exactly the fingerprints the source kept. Only the stretch with every shingle (before
        the response's own sampling) can be; past it nothing is known, so nothing is a hole.
        A winnowed response shares its own fingerprints with a source of the same window.
        """
        cached = self._kept.get((w, mod))
        if cached is not None:
            return cached
        if self.params.w == 1 and w > 1:
            every = int(np.searchsorted(self.offsets, self.params.sample_after)) if self.params.sample_mod > 1 else None
            dense = len(self.offsets) if every is None else every
            out = np.zeros(len(self.values), dtype=bool)
            out[winnow(self.values[:dense], w)] = True
        else:
            out = np.ones(len(self.values), dtype=bool)
        if mod > 1:
            out &= self.values % np.uint64(mod) == 0
        self._kept[(w, mod)] = out
        return out

    def explained(self, more: npt.NDArray[np.bool_]) -> Response:
        """The same response with ``more`` fingerprints blind too (its window cache kept)."""
        if not more.any():
            return self
        unsure = None if self.unsure is None else self.unsure & ~more
        return Response(self.values, self.offsets, self.blind | more, self.params, unsure, self._kept)

    def blind_within(self, found: Spans, *, explains: bool = True) -> None:
        """Everything inside ``found`` is blind from now on (the recipient's own text).

        ``explains``: its tokens are known text, which no copy claims; else those not blind before
        are ``unsure`` and explain none, until a later call says they do.
        """
        if len(found[0]):
            inside = within(self.offsets, found)
            if not explains:
                fresh = inside & ~self.blind
                self.unsure = fresh if self.unsure is None else self.unsure | fresh
            elif self.unsure is not None:
                self.unsure &= ~inside
            self.blind |= inside
            self._explained = None


Spans = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]


def spans_of(starts: npt.NDArray[np.int64], length: int) -> Spans:
    """``[s, s + length)`` for each of the sorted ``starts``, merged where they touch or overlap."""
    if not len(starts):
        return starts, starts
    new = np.concatenate(([True], starts[1:] > starts[:-1] + length))
    return starts[new], np.concatenate((starts[np.flatnonzero(new)[1:] - 1] + length, starts[-1:] + length))


# Merged spans' starts and ends, and the total length of the spans before each (one more than spans).
Explained = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]


def _prefix_lengths(merged: Spans) -> Explained:
    starts, ends = merged
    return starts, ends, np.concatenate(([0], np.cumsum(ends - starts))).astype(np.int64)


def _covered_below(explained: Explained, x: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Tokens below each ``x`` inside the spans."""
    starts, ends, before = explained
    if not len(starts):
        return np.zeros_like(x)
    i = np.searchsorted(ends, x, "right")  # spans ending at or before x count whole
    at = starts[np.minimum(i, len(starts) - 1)]
    partial = np.where((i < len(starts)) & (at < x), x - at, 0)
    out: npt.NDArray[np.int64] = before[i] + partial
    return out


def merged(intervals: Iterable[tuple[int, int]]) -> Spans:
    """Half-open ``[start, end)`` intervals, merged where they touch or overlap, as sorted starts and ends."""
    starts: list[int] = []
    ends: list[int] = []
    for start, end in sorted(intervals):
        if ends and start <= ends[-1]:
            ends[-1] = max(ends[-1], end)
        else:
            starts.append(start)
            ends.append(end)
    return np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)


def within(offsets: npt.NDArray[Any], found: Spans) -> npt.NDArray[np.bool_]:
    """Which ``offsets`` lie inside one of the merged ``found``: one binary search each."""
    starts, ends = found
    if not len(starts):
        return np.zeros(len(offsets), dtype=bool)
    at = np.searchsorted(starts, offsets, "right") - 1
    return (at >= 0) & (offsets < ends[np.maximum(at, 0)])


def spans(found: list[Piece]) -> Spans:
    """The response stretches the pieces cover, merged, as sorted starts and ends."""
    return merged((p.start, p.end) for p in found)


def stretches(found: list[Piece]) -> Spans:
    """What the pieces of ``STRETCH_TOKENS`` or more cover: where whose text it is is more than chance
    (``pieces(..., least=STRETCH_TOKENS)`` makes only those)."""
    return spans([p for p in found if p.copied >= STRETCH_TOKENS])


def outside(matches: list[Match], found: Spans) -> list[Match]:
    """The matches in none of the stretches."""
    if not len(found[0]) or not matches:
        return matches
    inside = within(np.fromiter((m.response_offset for m in matches), np.int64, len(matches)), found)
    return [m for m, x in zip(matches, inside.tolist(), strict=True) if not x]


def holes(response: Response, matches: list[Match], sources: dict[int, Params], held: Sequence[int] = ()) -> list[int]:
    """Sorted response offsets where the source tenant's text would show, had it been copied, and does not.

    ``matches`` are all of one tenant's; ``held``: more response offsets where the tenant holds
    the same text, in the same document and place, that are not evidence (what the model also
    said to other tenants, say): no hole either. Its documents may have different windows: the
    widest is used (it keeps the fewest, so fewer holes are claimed). Where one was sampled, only
    values divisible by its ``sample_mod`` could match.
    """
    if not matches:
        return []
    w = max(sources[m.source_doc].w for m in matches)
    mods = [sources[m.source_doc].sample_mod for m in matches if m.source_offset >= sources[m.source_doc].sample_after]
    could = response.kept(w, max(mods, default=1)) & ~response.blind
    has = np.fromiter((m.response_offset for m in matches), np.int64, len(matches))
    could &= ~np.isin(response.offsets, np.concatenate((has, np.asarray(held, dtype=np.int64))))
    return response.offsets[could].tolist()  # type: ignore[no-any-return]


def _between(
    sorted_offsets: npt.NDArray[np.int64], lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]
) -> npt.NDArray[np.bool_]:
    """Is one of ``sorted_offsets`` strictly between each ``lo`` and its ``hi``?"""
    if not len(sorted_offsets):
        return np.zeros(len(lo), dtype=bool)
    i = np.searchsorted(sorted_offsets, lo, "right")
    out: npt.NDArray[np.bool_] = (i < len(sorted_offsets)) & (
        sorted_offsets[np.minimum(i, len(sorted_offsets) - 1)] < hi
    )
    return out


def _source_params(docs: npt.NDArray[np.int64], sources: dict[int, Params]) -> tuple[npt.NDArray[np.int64], ...]:
    """Each doc's window, ``sample_after`` and ``sample_mod``, as arrays beside ``docs``."""
    distinct, at = np.unique(docs, return_inverse=True)
    params = [sources[d] for d in distinct.tolist()]
    w = np.array([p.w for p in params], dtype=np.int64)
    after = np.array([p.sample_after for p in params], dtype=np.int64)
    mod = np.array([p.sample_mod for p in params], dtype=np.int64)
    return w[at], after[at], mod[at]


def widest_gap(matches: list[Match], sources: dict[int, Params]) -> int:
    """The most shingles apart two fingerprints the sources of ``matches`` keep can be, next to one another
    (w, times ``sample_mod`` past ``sample_after``): how far their text may go on unseen beyond the matches,
    and one (1 with no matches)."""
    if not matches:
        return 1
    docs = np.fromiter((m.source_doc for m in matches), np.int64, len(matches))
    src = np.fromiter((m.source_offset for m in matches), np.int64, len(matches))
    w, after, mod = _source_params(docs, sources)
    return int((w * np.where(src >= after, mod, 1)).max())


def pieces(
    matches: list[Match],
    gaps: list[int],
    sources: dict[int, Params],
    n: int,
    response: Response | None = None,
    least: int = 0,
) -> list[Piece]:
    """The exact pieces of one tenant's matches: one diagonal of one document, no hole (``gaps``) between;
    those of other documents over one text widened to it (``_one_text``, ``Piece.own``).

    Matches off the diagonal do not cut a piece: the index keeps one offset per document and
    fingerprint, so a phrase the source repeats points back to its first occurrence, and is
    still the tenant's text where the copy has it. A piece also ends where the next match of its
    diagonal is further than ``GAP_TOKENS`` on (times ``sample_mod`` where the source was sampled).

    ``copied``: the tokens of its matched shingles, and of what lies between two matches no
    further apart than the source keeps them (w, times ``sample_mod`` past ``sample_after``),
    that no blind shingle explains. Only pieces that copied at least ``least`` tokens are returned
    (``STRETCH_TOKENS``: only stretches are asked for).

    In numpy, not per match: a response of one value repeated (a model stuck in a loop, or a
    hostile sender) makes every match a piece of its own, and 100,000 of them took seconds.
    """
    if not matches:
        return []
    count = len(matches)
    resp = np.fromiter((m.response_offset for m in matches), np.int64, count)
    doc = np.fromiter((m.source_doc for m in matches), np.int64, count)
    src = np.fromiter((m.source_offset for m in matches), np.int64, count)
    order = np.lexsort((resp, src - resp, doc))  # by document, diagonal, response offset; stable
    resp, doc, src = resp[order], doc[order], src[order]
    w, after, mod = _source_params(doc, sources)
    sampled = np.where((mod > 1) & (src >= after), mod, 1)
    step = resp[1:] - resp[:-1]
    cut = (
        (doc[1:] != doc[:-1])
        | (src[1:] - resp[1:] != src[:-1] - resp[:-1])
        | (step > GAP_TOKENS * sampled[:-1])
        | _between(np.asarray(gaps, dtype=np.int64), resp[:-1], resp[1:])
    )
    first = np.flatnonzero(np.concatenate(([True], cut)))
    last = np.concatenate((first[1:] - 1, [count - 1]))
    run = np.cumsum(np.concatenate(([True], cut))) - 1  # each match's piece
    dense = np.maximum(n, w[last] * sampled[last])  # matches of a copy are at most this far apart
    # Each match vouches for the tokens up to the next one of its piece, at most ``dense``; the last, its shingle.
    reach = np.concatenate((np.where(cut, n, np.minimum(step, dense[run[:-1]])), [n]))
    copied = reach if response is None else response.free(resp, resp + reach)
    totals = np.add.reduceat(copied, first)
    found = [
        Piece(start, end, d, source_start, source_end, fingerprints, c)
        for start, end, d, source_start, source_end, fingerprints, c in zip(
            resp[first].tolist(),
            (resp[last] + n).tolist(),
            doc[first].tolist(),
            src[first].tolist(),
            (src[last] + n).tolist(),
            (last - first + 1).tolist(),
            totals.tolist(),
            strict=True,
        )
    ]
    group = _one_text(resp[first], resp[last] + n, doc[first], n)
    if (group != np.arange(len(group))).any():
        found = _united(found, group, resp, resp + reach, run, response)
    return [p for p in found if p.copied >= least] if least > 0 else found


def _one_text(
    starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], docs: npt.NDArray[np.int64], n: int
) -> npt.NDArray[np.int64]:
    """Per piece (by its ``starts``, ``ends`` and ``docs``), the first piece of the text it belongs to (``_united``).

    Pieces of different documents of the tenant that overlap by a shingle or more in the response are
    one text the tenant holds twice: a prompt and the answer that echoed it, or the chat's next turn
    sending it back. The index names the tenant's first document per fingerprint, so the shingles
    the prompt's winnowing left out show in the answer, on its own diagonal, between the prompt's.
    Pieces of one document on two diagonals stay apart: a phrase the document repeats.
    """
    group: npt.NDArray[np.int64] = np.arange(len(starts), dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    ordered_ends = np.maximum.accumulate(ends[order])
    if not (starts[order][1:] <= ordered_ends[:-1] - n).any():
        return group  # nothing overlaps: one numpy pass, whatever the number of pieces
    head, head_end, head_docs = -1, 0, set[int]()
    for i, start, end, doc in zip(
        order.tolist(), starts[order].tolist(), ends[order].tolist(), docs[order].tolist(), strict=True
    ):
        if head >= 0 and start <= head_end - n and doc not in head_docs:
            group[i] = head
            head_end = max(head_end, end)
            head_docs.add(doc)
        else:
            head, head_end, head_docs = i, end, {doc}
    return group


def _united(
    found: list[Piece],
    group: npt.NDArray[np.int64],
    lo: npt.NDArray[np.int64],
    hi: npt.NDArray[np.int64],
    run: npt.NDArray[np.int64],
    response: Response | None,
) -> list[Piece]:
    """Each piece of a text of several (``_one_text``) as that text: its span, its own document with the
    source offsets carried along its diagonal, and the tokens any of the text's pieces vouches for
    (``Piece.own``). The pieces of one text then have one span, so no copy chains two of them; each
    stays a piece of its own document, so that a copy continues from either (the prompt's next
    piece, past a substituted word, continues the prompt's)."""
    heads, at = np.unique(group, return_inverse=True)
    # The tokens the matches vouch for, each once: [lo, hi) sorted per text, less what an earlier one covered.
    text = at[run]
    shift = (text * (int(hi.max()) + 1)).astype(np.int64)  # texts apart on one line, so one running max serves all
    order = np.lexsort((lo, text))
    a, b = lo[order] + shift[order], hi[order] + shift[order]
    covered = np.concatenate(([0], np.maximum.accumulate(b)[:-1]))
    a = np.maximum(a, covered)
    b = np.maximum(b, a)
    free = (b - a) if response is None else response.free(a - shift[order], b - shift[order])
    totals = np.bincount(text[order], weights=free, minlength=len(heads)).astype(np.int64).tolist()
    members = np.bincount(at, minlength=len(heads)).tolist()
    first: list[int] = [np.iinfo(np.int64).max] * len(heads)
    last: list[int] = [0] * len(heads)
    for p, t in zip(found, at.tolist(), strict=True):
        first[t], last[t] = min(first[t], p.start), max(last[t], p.end)
    out = []
    for p, t in zip(found, at.tolist(), strict=True):
        if members[t] == 1:
            out.append(p)
            continue
        source_start = max(p.source_start - (p.start - first[t]), 0)
        source_end = p.source_end + (last[t] - p.end)
        out.append(Piece(first[t], last[t], p.source_doc, source_start, source_end, p.fingerprints, totals[t], p))
    return out


@dataclass(frozen=True, slots=True)
class _Order:
    """Pieces in response order, as columns."""

    start: npt.NDArray[np.int64]
    end: npt.NDArray[np.int64]
    doc: npt.NDArray[np.int64]
    source_start: npt.NDArray[np.int64]
    source_end: npt.NDArray[np.int64]
    w: npt.NDArray[np.int64]  # the window of each piece's source

    @classmethod
    def of(cls, order: list[Piece], sources: dict[int, Params]) -> _Order:
        def column(name: str) -> npt.NDArray[np.int64]:
            return np.fromiter((getattr(p, name) for p in order), np.int64, len(order))

        doc = column("source_doc")
        w = _source_params(doc, sources)[0]
        return cls(column("start"), column("end"), doc, column("source_start"), column("source_end"), w)


def _joins(o: _Order, lag: int, n: int, gaps: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """For each piece from the ``lag``-th on (in response order), does it continue the copy that the
    piece ``lag`` before it ends?

    In the response it comes next (overlapping by less than a shingle), at most GAP_TOKENS
    on. In the source, either it starts where the one before stopped, give or take what a cut or a
    changed word can lose (n - 1 tokens, and w - 1 on each side where the source was winnowed):
    a fragment with other text inserted before it, or the rest of a copy past a substituted
    word; or it is another document of the tenant, abutting the one before with no hole between:
    a span the tenant had sent in two documents with different neighbours, of which the index
    names the first. ``w``: the later piece's source's.
    """
    count = len(o.start)
    start, end, doc, w = o.start[lag:], o.end[lag:], o.doc[lag:], o.w[lag:]
    before_end, before_doc = o.end[: count - lag], o.doc[: count - lag]
    gap = start - before_end
    near = (-n < gap) & (gap <= GAP_TOKENS) & (end > before_end)
    skip = o.source_start[lag:] - o.source_end[: count - lag]
    same = (doc == before_doc) & (-n < skip) & (skip <= n - 1 + 2 * (w - 1))
    other = (doc != before_doc) & (gap <= w) & ~_between(gaps, before_end - n, start)
    out: npt.NDArray[np.bool_] = near & (same | other)
    return out


def copies(found: list[Piece], n: int, sources: dict[int, Params], gaps: list[int], budget: Budget) -> list[Copy]:
    """The best copy ending at each piece, by score (module docstring); one pass in response order.

    A piece may start a copy or continue the best-scoring one it ``_joins`` among the
    ``budget.predecessors`` pieces before it, the nearest first. Which pieces join is one numpy
    pass per distance, so only pairs that join cost a step in Python: where none do (a hostile
    response of one value repeated: pieces of one shingle each), judging costs one copy per piece.
    """
    order = sorted(found, key=lambda p: (p.start, p.end))
    count, most = len(order), budget.predecessors
    o = _Order.of(order, sources)
    holes_at = np.asarray(gaps, dtype=np.int64)
    joined: list[list[int]] = [[] for _ in range(count)]  # per piece, the pieces it continues, nearest first
    for lag in range(1, min(most, count - 1) + 1):
        for j in (np.flatnonzero(_joins(o, lag, n, holes_at)) + lag).tolist():
            joined[j].append(j - lag)
    budget.checks += int(np.minimum(np.arange(count), most).sum())  # what each piece looked at
    if count > most + 1:  # pieces whose look back stopped before the ones it could still continue
        budget.cut += int((o.end[: count - most - 1] > o.start[most + 1 :] - GAP_TOKENS - n).sum())
    best: list[Copy] = []
    for j, piece in enumerate(order):
        chosen = Copy.of(piece, n)
        for i in joined[j]:
            longer = best[i].then(piece, n)
            if longer.score > chosen.score:
                chosen = longer
        best.append(chosen)
    # A copy another one continues is part of it: only the longest of each chain is kept, unless the
    # continuation scores less (a short piece overlapping its end): more evidence never hides a copy.
    continued = {id(c.before) for c in best if c.before is not None and c.score >= c.before.score}
    return [c for c in best if id(c) not in continued]


def evaluate(
    response: Response, matches: list[Match], sources: dict[int, Params], budget: Budget, held: Sequence[int] = ()
) -> list[Copy]:
    """One source tenant's copies in ``response`` (``held``: as for ``holes``)."""
    if not matches:
        return []
    gaps = holes(response, matches, sources, held)
    found = pieces(matches, gaps, sources, response.params.n, response)
    return copies(found, response.params.n, sources, gaps, budget)


def least_matches(t: Thresholds, w: int) -> int:
    """The fewest fingerprints a finding from a source winnowed with ``w`` can have.

    Matches of one copy are at most w apart, so a piece of m matches vouches for at most
    n + w (m - 1) tokens and scores at most w (m - 1) + 1; more pieces only need more.
    """
    return max(t.min_matched, 1 + -(-(t.min_score - 1) // w))


def is_finding(copied: list[Copy], t: Thresholds) -> bool:
    """More than a coincidence: a copy that scores ``min_score`` with at least ``min_matched`` fingerprints,
    and has a stretch. Short pieces in the source's order, with other words between, are the shape of
    an interleaved leak and of a template filled in twice (a class's methods beside another's); only
    the leak has somewhere an exact piece of the 8 tokens that make a copy (or a text of several
    documents' pieces, ``_one_text``, that vouch for 8 tokens together)."""
    return any(c.score >= t.min_score and c.fingerprints >= t.min_matched and c.stretch for c in copied)


def longest(copied: list[Copy]) -> int:
    """Tokens of the longest copy: its length, for severity."""
    return max((c.tokens for c in copied), default=0)


def _tokens(found: list[Piece]) -> int:
    """Response tokens the pieces cover, their overlaps counted once."""
    covered, reach = 0, 0
    for p in sorted(found, key=lambda p: p.start):
        start = max(p.start, reach)
        if p.end > start:
            covered += p.end - start
            reach = p.end
    return covered


def coverage(found: list[Piece], response_tokens: int) -> float:
    """Share of the response's tokens inside the pieces."""
    if response_tokens <= 0:
        return 0.0
    return min(1.0, _tokens(found) / response_tokens)


def severity(longest_copy: int, t: Thresholds, *, canary: bool = False) -> Severity:
    if canary or longest_copy >= t.critical_run_tokens:
        return Severity.CRITICAL
    if longest_copy >= t.high_run_tokens:
        return Severity.HIGH
    return Severity.LOW
