"""From matched fingerprints to evidence a responder can act on: runs, coverage, severity.

Pure functions over offsets, so scoring is tested without any backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Thresholds:
    n: int
    w: int
    min_matched: int
    min_run_tokens: int
    high_run_tokens: int
    critical_run_tokens: int


@dataclass(slots=True)
class Match:
    """One recipient fingerprint found in a source document."""

    response_offset: int
    source_doc: int
    source_offset: int


@dataclass(frozen=True, slots=True)
class Run:
    """Tokens ``[start, end)`` of the response matched tokens ``[source_start, source_end)`` of one source doc."""

    start: int
    end: int
    source_doc: int
    source_start: int
    source_end: int
    fingerprints: int

    @property
    def tokens(self) -> int:
        return self.end - self.start


@dataclass(slots=True)
class SourceEvidence:
    tenant: int
    matches: list[Match] = field(default_factory=list)


def runs(matches: list[Match], t: Thresholds) -> list[Run]:
    """Group matches into contiguous runs per source doc.

    Inside a shared run consecutive winnowed fingerprints are at most ``w`` shingles apart,
    so a larger gap (or a jump backwards in the source) starts a new run.
    """
    out: list[Run] = []
    by_doc: dict[int, list[Match]] = {}
    for m in matches:
        by_doc.setdefault(m.source_doc, []).append(m)
    for doc, ms in by_doc.items():
        ms.sort(key=lambda m: m.response_offset)
        group: list[Match] = []
        for m in ms:
            if group and (
                m.response_offset - group[-1].response_offset > t.w or m.source_offset < group[-1].source_offset
            ):
                out.append(_run(doc, group, t.n))
                group = []
            group.append(m)
        if group:
            out.append(_run(doc, group, t.n))
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


def is_finding(matched: int, longest_run: int, t: Thresholds) -> bool:
    """More than a coincidence: several fingerprints, and a contiguous run of real length."""
    return matched >= t.min_matched and longest_run >= t.min_run_tokens
