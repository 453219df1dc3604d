"""The impact report of one incident: who must be told what, and what the engines said meanwhile.

Built from the incident's findings (false positives left out and counted): per (source tenant,
recipient tenant) pair, every leaked response with its request ids and times; models,
deployments, nodes; the recipients' prompt lengths; and the engine integrity signals of the
incident's deployment over the same time range, widened by ``SIGNAL_MARGIN_SECONDS`` because
engine clocks and gateway clocks are not the same clock.
"""

from __future__ import annotations

import csv
import io
import statistics
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.findings.models import Finding
from service.incidents import store
from service.incidents.models import Incident
from service.incidents.schemas import Bucket, ImpactReport, Pair, PromptLengths, ResponseRef, SignalsSide
from service.signals.models import EngineSignal
from service.signals.schemas import SignalOut
from service.spreadsheet import safe_cell

SIGNAL_MARGIN_SECONDS = 300
MAX_SIGNALS = 500
# Recipient prompt length buckets (tokens, binary k/M): leaks past a KV pool's size show up at the top
# (docs/deployment-risk.md).
BUCKETS = (
    ("<32k", 0, 32 * 1024),
    ("32k-128k", 32 * 1024, 128 * 1024),
    ("128k-512k", 128 * 1024, 512 * 1024),
    ("512k-1M", 512 * 1024, 1024 * 1024),
    (">1M", 1024 * 1024, None),
)
CSV_COLUMNS = (
    "incident_id",
    "source_tenant",
    "recipient_tenant",
    "canary_source",
    "recipient_request_id",
    "source_request_ids",
    "response_at",
    "detected_at",
    "model",
    "deployment",
    "node",
    "prompt_tokens",
    "severity",
    "finding_id",
)


def _sources(finding: Finding) -> list[tuple[str, bool, list[str]]]:
    """Every source of a finding, from its evidence: (tenant, canary, request ids)."""
    out = []
    for source in finding.evidence.get("sources", ()):
        if isinstance(source, dict) and isinstance(source.get("tenant"), str):
            ids = [str(r) for r in source.get("request_ids", ())]
            out.append((source["tenant"], bool(source.get("canary")), ids))
    return out or [(finding.source_tenant, False, list(finding.source_request_ids))]


def prompt_lengths(values: list[int | None]) -> PromptLengths:
    known = sorted(v for v in values if v is not None)
    buckets = [
        Bucket(
            label=label,
            min_tokens=low,
            max_tokens=high,
            count=sum(1 for v in known if v >= low and (high is None or v < high)),
        )
        for label, low, high in BUCKETS
    ]
    return PromptLengths(
        known=len(known),
        unknown=len(values) - len(known),
        min=known[0] if known else None,
        median=float(statistics.median(known)) if known else None,
        max=known[-1] if known else None,
        buckets=buckets,
    )


async def _signals(session: AsyncSession, deployment: str | None, since: datetime, until: datetime) -> SignalsSide:
    if deployment is None:
        return SignalsSide(deployment=None, since=since, until=until, total=0, by_kind={}, items=[], truncated=False)
    where = (EngineSignal.deployment == deployment, EngineSignal.ts >= since, EngineSignal.ts <= until)
    rows = list(
        (
            await session.scalars(
                select(EngineSignal).where(*where).order_by(EngineSignal.ts, EngineSignal.id).limit(MAX_SIGNALS + 1)
            )
        ).all()
    )
    kinds = await session.execute(
        select(EngineSignal.kind, func.count(), func.sum(EngineSignal.count)).where(*where).group_by(EngineSignal.kind)
    )
    by_kind, total = {}, 0
    for kind, events, count in kinds:
        by_kind[str(kind)] = int(count or 0)
        total += int(events)
    return SignalsSide(
        deployment=deployment,
        since=since,
        until=until,
        total=total,
        by_kind=dict(sorted(by_kind.items())),
        items=[SignalOut.model_validate(r) for r in rows[:MAX_SIGNALS]],
        truncated=len(rows) > MAX_SIGNALS,
    )


async def report(session: AsyncSession, incident: Incident) -> ImpactReport:
    found = await store.findings_of(session, incident.id)
    leaked = [f for f, link in found if not link.false_positive]
    pairs: dict[tuple[str, str], tuple[bool, list[ResponseRef]]] = {}
    for f in leaked:
        for tenant, canary, request_ids in _sources(f):
            ref = ResponseRef(
                finding_id=f.id,
                recipient_request_id=f.recipient_request_id,
                source_request_ids=request_ids,
                response_at=f.response_at,
                detected_at=f.detected_at,
                model=f.model,
                deployment=f.deployment,
                node=f.node,
                prompt_tokens=f.prompt_tokens,
                severity=f.severity,
            )
            pairs.setdefault((tenant, f.recipient_tenant), (canary, []))[1].append(ref)
    pair_list = [
        Pair(
            source_tenant=source,
            recipient_tenant=recipient,
            canary=canary,
            response_count=len(refs),
            first_seen_at=min(r.response_at for r in refs),
            last_seen_at=max(r.response_at for r in refs),
            responses=refs,
        )
        for (source, recipient), (canary, refs) in sorted(pairs.items())
    ]
    first = min((f.response_at for f in leaked), default=None)
    last = max((f.response_at for f in leaked), default=None)
    margin = timedelta(seconds=SIGNAL_MARGIN_SECONDS)
    signals = await _signals(
        session,
        incident.deployment,
        (first or incident.first_seen_at) - margin,
        (last or incident.last_seen_at) + margin,
    )
    return ImpactReport(
        incident=await store.out(session, incident),
        source_tenants=sorted({p.source_tenant for p in pair_list}),
        recipient_tenants=sorted({f.recipient_tenant for f in leaked}),
        response_count=len(leaked),
        first_seen_at=first,
        last_seen_at=last,
        models=sorted({f.model for f in leaked}),
        deployments=sorted({f.deployment for f in leaked if f.deployment is not None}),
        nodes=sorted({f.node for f in leaked if f.node is not None}),
        prompt_tokens=prompt_lengths([f.prompt_tokens for f in leaked]),
        pairs=pair_list,
        false_positive_findings=len(found) - len(leaked),
        signals=signals,
    )


def _cell(value: object) -> str:
    """Times in UTC as the JSON answers write them (pydantic's ``...Z``, not Python's ``+00:00``), so
    that a CSV row and the JSON report of the same response match as text."""
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return safe_cell("" if value is None else str(value))


def to_csv(report: ImpactReport) -> str:
    """One row per (pair, leaked response): the list to notify customers from."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for pair in report.pairs:
        for r in pair.responses:
            writer.writerow(
                [
                    _cell(v)
                    for v in (
                        report.incident.id,
                        pair.source_tenant,
                        pair.recipient_tenant,
                        "true" if pair.canary else "false",
                        r.recipient_request_id,
                        " ".join(r.source_request_ids),
                        r.response_at,
                        r.detected_at,
                        r.model,
                        r.deployment,
                        r.node,
                        r.prompt_tokens,
                        r.severity,
                        r.finding_id,
                    )
                ]
            )
    return buffer.getvalue()
