"""From matched fingerprints to evidence a responder can act on: runs, coverage, severity.

Pure functions over offsets, so scoring is tested without any backend. docs/detection.md gives
the reasoning and the measured effect of each threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from service.fingerprint.scheme import Params

# Consecutive matches of one run may be this many tokens apart: a changed word costs n shingles,
# and shingles shared with many tenants (common) are left out, which can leave longer gaps.
# Staying on one diagonal (below) is what keeps unrelated matches apart, not the gap.
GAP_TOKENS = 64
# ... and the source may drift by this many tokens against the response (inserted or dropped words).
SHIFT_TOLERANCE = 8


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_matched: int
    min_run_tokens: int
    min_purity: float
    high_run_tokens: int
    critical_run_tokens: int


@dataclass(frozen=True, slots=True)
class Match:
    """One recipient fingerprint found in a source document."""

    response_offset: int
    source_doc: int
    source_offset: int


@dataclass(frozen=True, slots=True)
class Run:
    """Tokens ``[start, end)`` of the response matched ``[source_start, source_end)`` of one source doc."""

    start: int
    end: int
    source_doc: int
    source_start: int
    source_end: int
    fingerprints: int
    purity: float = 1.0

    @property
    def tokens(self) -> int:
        return self.end - self.start


def _stride(params: Params, offset: int) -> int:
    """How far apart consecutive fingerprints of a shared run may be at ``offset``."""
    sampled = params.sample_mod if params.sample_mod > 1 and offset >= params.sample_after else 1
    return max(GAP_TOKENS, 3 * params.w) * sampled


def runs(matches: list[Match], response: Params, sources: dict[int, Params]) -> list[Run]:
    """Group matches into runs: same source doc, close together, on the same diagonal.

    A leak copies a contiguous span, so response and source offsets advance together; a match
    that jumps in the source, or comes after a longer gap than the sampling allows, starts a
    new run. Fragments of one source interleaved with other text become separate runs.
    """
    out: list[Run] = []
    by_doc: dict[int, list[Match]] = {}
    for m in matches:
        by_doc.setdefault(m.source_doc, []).append(m)
    for doc, ms in by_doc.items():
        source = sources[doc]
        ms.sort(key=lambda m: m.response_offset)
        group: list[Match] = []
        for m in ms:
            if group:
                prev = group[-1]
                gap = m.response_offset - prev.response_offset
                advance = m.source_offset - prev.source_offset
                allowed = max(_stride(response, prev.response_offset), _stride(source, prev.source_offset))
                # A copy moves forward in both texts together; a repeated phrase in the
                # response matching one spot of the source again does not.
                if gap > allowed or advance <= 0 or abs(gap - advance) > SHIFT_TOLERANCE:
                    out.append(_run(doc, group, response.n))
                    group = []
            group.append(m)
        if group:
            out.append(_run(doc, group, response.n))
    return sorted(out, key=lambda r: (r.start, r.source_doc))


def _run(doc: int, group: list[Match], n: int) -> Run:
    return Run(
        start=group[0].response_offset,
        end=group[-1].response_offset + n,
        source_doc=doc,
        source_start=min(m.source_offset for m in group),
        source_end=max(m.source_offset for m in group) + n,
        fingerprints=len(group),
    )


def with_purity(
    run: Run,
    values: npt.NDArray[np.uint64],
    offsets: npt.NDArray[np.uint32],
    counted: npt.NDArray[np.bool_],
    n: int,
    source: Params,
) -> Run:
    """The run's share of the response fingerprints it spans that could have matched.

    A copied span matches nearly every fingerprint inside it; two texts that only share a
    template ("fix X for Y" / "fix Z for Y") match its ends and miss the middle. Fingerprints
    that could not count are left out of the share: common, allowlisted or self-echo ones, and
    those the source's sampling dropped (only values divisible by its ``sample_mod`` survive).
    """
    lo = int(np.searchsorted(offsets, run.start, "left"))
    hi = int(np.searchsorted(offsets, run.end - n, "right"))
    possible = counted[lo:hi]
    if source.sample_mod > 1 and run.source_start >= source.sample_after:
        possible = possible & (values[lo:hi] % np.uint64(source.sample_mod) == 0)
    return replace(run, purity=run.fingerprints / max(int(possible.sum()), run.fingerprints))


def coverage(found: list[Run], response_tokens: int) -> float:
    """Share of the response's tokens inside matched runs."""
    if response_tokens <= 0:
        return 0.0
    covered, reach = 0, 0
    for r in sorted(found, key=lambda r: r.start):
        start = max(r.start, reach)
        if r.end > start:
            covered += r.end - start
            reach = r.end
    return min(1.0, covered / response_tokens)


def severity(longest_run: int, t: Thresholds, *, canary: bool = False) -> str:
    if canary or longest_run >= t.critical_run_tokens:
        return "critical"
    if longest_run >= t.high_run_tokens:
        return "high"
    return "low"


def is_finding(found: list[Run], t: Thresholds) -> bool:
    """More than a coincidence: one run with several fingerprints, a real length, and no holes."""
    return any(
        r.fingerprints >= t.min_matched and r.tokens >= t.min_run_tokens and r.purity >= t.min_purity for r in found
    )
