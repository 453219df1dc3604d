"""The evaluation's traffic through the service's own ingest path, in process: for tuning.

``Ingestor.process`` on the embedded index (the same contract as Redis: tests/test_index_contract.py)
with findings collected in memory instead of a database: minutes instead of most of an hour,
so a rule can be tried on several seeds and families. Numbers that are reported come from
``run.py`` on Redis and PostgreSQL; this only decides what is worth that run.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np
import orjson

from bench.eval.traffic import Traffic, wire
from bleedwatch.exchange import fingerprint_exchange
from bleedwatch.fingerprint.scheme import Params, fingerprint_text
from service.config import Settings
from service.findings.draft import FindingDraft
from service.findings.store import replaces
from service.findings.writer import FindingsWriter, Written
from service.index.base import DocMeta, Kind
from service.index.memory import MemoryIndex
from service.index.window import Window
from service.ingest.decode import Limits
from service.ingest.service import Ingestor
from service.matching.known import NO_CANARIES, Known, KnownFingerprints
from service.matching.matcher import Matcher
from service.matching.thresholds import thresholds

# The traffic's clock: an exchange every quarter second, ending before the replay starts. The 12,160
# exchanges of a run then span 51 minutes, most of the default one-hour window, as a gateway's would:
# a quote sent long after an answer is as far from it as in real traffic (BLEEDWATCH_MAX_REQUEST_SECONDS).
SECONDS_PER_EXCHANGE = 0.25


class _Allowlist(KnownFingerprints):
    def __init__(self, values: np.ndarray[Any, np.dtype[np.uint64]]) -> None:
        self._known = Known(np.unique(values), NO_CANARIES)

    async def get(self, key_id: str) -> Known:
        return self._known


class _Index(MemoryIndex):
    """The embedded index, remembering which document each request's response is."""

    responses: dict[str, tuple[str, int, int]]  # request id -> key id, doc ref, tenant ref

    async def put_docs(self, key_id: str, docs: dict[int, DocMeta], now: float) -> set[int]:
        refs = await self.tenant_refs(sorted({m.tenant for m in docs.values()}))
        for ref, meta in docs.items():
            if meta.kind == Kind.RESPONSE:
                self.responses[meta.request_id] = (key_id, ref, refs[meta.tenant])
        return await super().put_docs(key_id, docs, now)


@dataclass
class Replayed:
    findings: list[dict[str, Any]]
    seconds: float
    index: _Index
    matcher: Matcher
    drafted: list[dict[str, Any]]  # with --judge-after: every finding, the withdrawn ones too

    async def why(self, recipient_request: str) -> dict[str, str]:
        """What the matcher finds in that response now, per source tenant (``Matcher.why``)."""
        key_id, ref, tenant = self.index.responses[recipient_request]
        return await self.matcher.why(key_id, ref, tenant, time.time())

    async def judge_again(self, recipient_request: str) -> FindingDraft | None:
        """That response judged against the index as it is now (``Matcher.judge_again``)."""
        key_id, ref, tenant = self.index.responses[recipient_request]
        return await self.matcher.judge_again(key_id, ref, tenant, time.time())


class _Collect(FindingsWriter):
    """Findings are upserts on the recipient's request, kept as the database keeps them (``store.replaces``):
    a later draft replaces an earlier one only if it is stronger, not because it is later."""

    def __init__(self) -> None:
        self.drafts: dict[str, FindingDraft] = {}
        self.batch = 0  # batches processed so far
        self.first_batch: dict[str, int] = {}  # recipient request -> the batch its first draft came in

    async def write(self, drafts: list[FindingDraft]) -> Written | None:
        for d in drafts:
            self.first_batch.setdefault(d.recipient_request_id, self.batch)
            old = self.drafts.get(d.recipient_request_id)
            if old is None or replaces(d, old):
                self.drafts[d.recipient_request_id] = d
        return None


def allowlist(texts: list[str], key: bytes, params: Params) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """Fingerprints of ``texts`` with every shingle, as ``bleedwatch allowlist add`` stores them."""
    every = Params(n=params.n, w=1, sample_mod=1)
    parts = [fingerprint_text(t, key, every).values for t in texts]
    return np.concatenate(parts) if parts else np.empty(0, np.uint64)


async def replay(
    traffic: Traffic,
    key: bytes,
    params: Params,
    allowed: np.ndarray[Any, np.dtype[np.uint64]],
    batch: int = 100,
    judge_after: float | None = None,
) -> Replayed:
    """Findings as ``GET /v1/findings`` shows them (the fields the scoring reads), and the seconds it took.

    ``judge_after``: keep only findings that ``Matcher.confirm`` still finds that many seconds of traffic
    after their first draft (a finding withdrawn then stays withdrawn; one drafted in the last stretch is
    kept): what BLEEDWATCH_FINDINGS_HOLD_SECONDS does (service/findings/writer.py)."""
    settings = Settings()
    start = time.time() - SECONDS_PER_EXCHANGE * (len(traffic.order) + 100)
    index = _Index(
        Window(settings.retention_seconds, settings.index_generations),
        settings.common_prompt_tenants,
        settings.common_tenants,
    )
    index.responses = {}
    writer = _Collect()
    matcher = Matcher(index, _Allowlist(allowed), thresholds(settings), settings.max_request_seconds)
    limits = Limits(
        settings.max_batch_exchanges, settings.max_fingerprints_per_text, 10**9, None, settings.accepted_key_ids
    )
    ingestor = Ingestor(index, matcher, cast(Any, None), limits, writer)
    started = time.perf_counter()
    # --judge-after: whether each finding still is one when judged again that long after its first draft.
    settled: dict[str, bool] = {}
    for first in range(0, len(traffic.order), batch):
        exchanges = []
        for ex in traffic.order[first : first + batch]:
            w = wire(ex)
            exchanges.append(
                fingerprint_exchange(
                    w["prompt"],
                    w["response"],
                    key=key,
                    tenant=w["tenant"],
                    request_id=w["request_id"],
                    model="eval-model",
                    ts=start + ex.ts * SECONDS_PER_EXCHANGE,
                    params=params,
                )
            )
        await ingestor.process(b"\n" + orjson.dumps({"exchanges": exchanges}))
        writer.batch += 1
        if judge_after is not None:
            due = writer.batch - judge_after / (SECONDS_PER_EXCHANGE * batch)
            for rid, b in list(writer.first_batch.items()):
                if b <= due and rid not in settled:
                    key_id, ref, tenant = index.responses[rid]
                    source = writer.drafts[rid].source_ref
                    settled[rid] = await matcher.confirm(key_id, ref, tenant, time.time(), source)
    drafted = [_as_api(d) for d in writer.drafts.values()]
    found = [f for f in drafted if settled.get(f["recipient_request_id"], True)]
    return Replayed(found, time.perf_counter() - started, index, matcher, drafted)


def _as_api(d: FindingDraft) -> dict[str, Any]:
    out = asdict(d)
    out.pop("matched_values")
    return out
