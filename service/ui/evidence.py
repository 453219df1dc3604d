"""A finding's evidence as bars along its response: the token ranges GET /v1/findings/{id} returns.

The evidence holds positions only (``evidence.sources[].ranges[].response``, token offsets into the
recipient's response), never text, so the picture is a strip ``response_tokens`` long with each
copied stretch filled, one strip per source. The values come from the database as JSON: anything
not a pair of integers is skipped and every range is clamped to the strip, so a malformed row draws
less, never breaks the page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.findings.models import Finding


@dataclass(frozen=True, slots=True)
class Bar:
    start: int
    end: int
    source_request_id: str
    source_start: int | None
    source_end: int | None
    fingerprints: int | None


@dataclass(frozen=True, slots=True)
class SourceStrip:
    tenant: str
    canary: bool
    coverage: float | None
    bars: list[Bar]


@dataclass(frozen=True, slots=True)
class Drawing:
    tokens: int  # the strip's length: the response's tokens (at least the last range's end)
    strips: list[SourceStrip]


def _pair(value: Any) -> tuple[int, int] | None:
    if isinstance(value, list | tuple) and len(value) == 2 and all(type(v) is int for v in value):
        return int(value[0]), int(value[1])
    return None


def drawing(finding: Finding) -> Drawing:
    sources = finding.evidence.get("sources") if isinstance(finding.evidence, dict) else None
    raw: list[tuple[str, bool, float | None, list[dict[str, Any]]]] = []
    for source in sources if isinstance(sources, list) else []:
        if not isinstance(source, dict):
            continue
        ranges = source.get("ranges")
        coverage = source.get("coverage")
        raw.append(
            (
                str(source.get("tenant", "")),
                bool(source.get("canary")),
                float(coverage) if isinstance(coverage, int | float) else None,
                [r for r in ranges if isinstance(r, dict)] if isinstance(ranges, list) else [],
            )
        )
    ends = [p[1] for _, _, _, ranges in raw for r in ranges if (p := _pair(r.get("response"))) is not None]
    tokens = max([finding.response_tokens, *ends, 1])
    strips = []
    for tenant, canary, coverage, ranges in raw:
        bars = []
        for r in ranges:
            span = _pair(r.get("response"))
            if span is None:
                continue
            start, end = max(0, span[0]), min(tokens, span[1])
            if end <= start:
                continue
            source = _pair(r.get("source"))
            fingerprints = r.get("fingerprints")
            bars.append(
                Bar(
                    start,
                    end,
                    str(r.get("source_request_id", "")),
                    source[0] if source else None,
                    source[1] if source else None,
                    fingerprints if type(fingerprints) is int else None,
                )
            )
        strips.append(SourceStrip(tenant, canary, coverage, bars))
    return Drawing(tokens, strips)
