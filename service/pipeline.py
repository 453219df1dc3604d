"""The ingest path from the queue to the database, wired once for both processes that run it: an
API replica (``service/app.py``) and a worker process (``service/work.py``).

One builder so the two cannot drift: the same label caps shared by the ingestor and the findings
writer, the same incident policy, the same limits the API checked before queueing.
"""

from __future__ import annotations

import time
from contextlib import AsyncExitStack
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service import metrics
from service.config import Settings
from service.findings.draft import FindingDraft
from service.findings.writer import FindingsWriter, Judge
from service.incidents import grouping
from service.index.base import Index
from service.ingest.decode import Limits
from service.ingest.service import Ingestor
from service.ingest.worker import IngestWorker
from service.matching.known import KnownFingerprints
from service.matching.matcher import Matcher
from service.matching.thresholds import thresholds
from service.webhooks.sender import paging_routes


def limits(settings: Settings) -> Limits:
    """What ingest refuses (service/ingest/decode.py); the worker process re-checks with the same."""
    return Limits(
        settings.max_batch_exchanges,
        settings.max_fingerprints_per_text,
        settings.max_future_seconds,
        settings.effective_max_age_seconds,
        settings.accepted_key_ids,
        settings.new_tenants_per_key_per_minute,
    )


@dataclass(frozen=True, slots=True)
class Pipeline:
    known: KnownFingerprints
    incident_policy: grouping.Policy
    writer: FindingsWriter
    ingestor: Ingestor
    worker: IngestWorker

    def start(self, running: AsyncExitStack) -> None:
        """Start the writer and the queue worker; ``running`` stops them in reverse, the worker first."""
        self.writer.start()
        running.push_async_callback(self.writer.stop)
        self.worker.start()
        running.push_async_callback(self.worker.stop)


def confirmer(matcher: Matcher) -> Judge:
    """A finding on hold judged again against the index as it is when the hold is over."""

    async def confirm(draft: FindingDraft) -> bool:
        if draft.response_ref is None or draft.recipient_ref is None:
            return True  # never put on hold without them (FindingsWriter._holds)
        now = time.time()
        return await matcher.confirm(draft.key_id, draft.response_ref, draft.recipient_ref, now, draft.source_ref)

    return confirm


def build_pipeline(settings: Settings, sessions: async_sessionmaker[AsyncSession], index: Index) -> Pipeline:
    labels = metrics.Labels.from_settings(settings)  # one per process: writer and ingestor share it
    # Findings join incidents in the session that stores them (service/incidents/grouping.py).
    incident_policy = grouping.Policy(settings.incident_quiet_seconds, paging_routes(settings))
    known = KnownFingerprints(sessions, settings.lists_refresh_seconds)
    largest = settings.max_fingerprints_per_text
    matcher = Matcher(index, known, thresholds(settings), settings.max_request_seconds, largest)
    # Findings held while the database was down, written when it is back; a purged tenant's are
    # refused; a held finding that keeps failing is moved aside; findings on hold are judged again.
    writer = FindingsWriter(
        sessions,
        index.outbox(),
        index.purged,
        max_attempts=settings.findings_outbox_max_attempts,
        dead_letter_seconds=settings.dead_letter_retention_seconds,
        policy=incident_policy,
        labels=labels,
        hold_seconds=settings.findings_hold_seconds,
        judge=confirmer(matcher),
    )
    ingestor = Ingestor(
        index,
        matcher,
        sessions,
        limits(settings),
        writer,
        settings.ingest_queue_max_batches,
        settings.ingest_queue_max_bytes,
        labels=labels,
    )
    worker = IngestWorker(
        ingestor,
        index.queue(),
        settings.ingest_workers,
        settings.ingest_reclaim_seconds,
        dead_letter_seconds=settings.dead_letter_retention_seconds,
    )
    return Pipeline(known, incident_policy, writer, ingestor, worker)
