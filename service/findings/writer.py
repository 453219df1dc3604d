"""Findings written to the database with their incident, and held through a database outage.

Each finding created or extended is put into its incident in the same session
(``service.incidents.grouping``), so one commit covers both; the store itself knows nothing of
incidents. The rest of this module is how findings survive a database outage: held in the
index's outbox, written when it is back.

Ingest and matching need only the index (Redis); the database stores what they conclude. When
the findings of a batch cannot be written because the database is unreachable, they are
appended to the outbox (a Redis Stream, ``service/index/outbox.py``) and the batch is answered
202 as usual: nothing is lost, and the gateway has nothing to resend. Every replica runs
``FindingsWriter.tick`` every few seconds, which moves held findings into the database once it answers again.

None are duplicated: findings are upserts on (recipient tenant, recipient request id) whose
evidence only grows, so a finding written twice (a replica died between its commit and its
release, or a newer evaluation was written first) is one row. Metrics of a new finding are
recorded by whichever write creates the row.

Findings about a moment at or before a tenant's purge, that involve it, are dropped (or, where it
is only a minor source, scrubbed of it) before they are written, held or drained: work accepted
or held before the purge must not bring its data back (service/retention/jobs.py).

Only an outage goes to the outbox (connection refused or lost, timeouts). Any other error fails
the batch (5xx) before its idempotency marks are written, so the retried batch is processed
again, whole.

A held finding the database refuses for another reason than an outage (a bug, a value it will
never take) is retried alone, so it holds back no other, and after ``max_attempts`` failed
writes it is moved to the outbox's dead letters with its reason
(``bleedwatch_findings_dead_letters_total``): left first in line it would be claimed first on
every round, forever. ``bleedwatch queue requeue-dead`` puts it back once the cause is fixed;
after ``dead_letter_seconds`` unrequeued it is deleted (``bleedwatch_dead_letters_expired_total``).
Attempts are counted per process; a replica that takes over abandoned items counts anew.

**The hold** (``hold_seconds``, BLEEDWATCH_FINDINGS_HOLD_SECONDS; 0, the default, raises findings
at once). Most false findings on traffic the rules were not tuned on quote public text, a notice
or a license, that one other tenant had sent just before: at that moment it looks exactly like a
leak of that tenant's prompt, and minutes later more tenants have sent it and it is common. A
finding on hold waits that long in the outbox (``Outbox.hold_until``), is judged again
(``judge``: ``Matcher.confirm``) and is written only if it still is one; else it is withdrawn
(``bleedwatch_findings_withdrawn_total``) and never reaches the database, an incident or a page.
Canaries are never held. The second judgment lets only public text take a finding back, not what a
leak itself causes (service/matching/matcher.py ``_classify``). The cost: pages come that much later,
and a finding is in ``GET /v1/findings`` only once the hold is over (bench/eval/RESULTS.md has
what it buys).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy.exc
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service import metrics
from service.db import DB_DOWN, session_scope
from service.findings import store
from service.findings.draft import FindingDraft
from service.findings.severity import Severity
from service.incidents import grouping
from service.index.base import Outbox
from service.periodic import Periodic

log = logging.getLogger(__name__)

DATABASE_DOWN = (*DB_DOWN, sqlalchemy.exc.TimeoutError, TimeoutError, ConnectionError)
CLAIM_COUNT = 200
DRAIN_SECONDS = 2.0
# A replica that claimed held findings and died leaves them to another one after this long.
ABANDONED_SECONDS = 60.0
DEFAULT_MAX_ATTEMPTS = 5
_DATETIMES = {f.name for f in dataclasses.fields(FindingDraft) if "datetime" in str(f.type)}
_FIELDS = {f.name for f in dataclasses.fields(FindingDraft)}


def encode_draft(draft: FindingDraft, judge: bool = False) -> bytes:
    """``judge``: a finding on hold, to be judged again before it is written."""
    held: dict[str, Any] = {"v": 1, "draft": dataclasses.asdict(draft)}
    if judge:
        held["judge"] = True
    return orjson.dumps(held)


# Fields renamed since a draft may have been held: a draft written before the upgrade still decodes.
_RENAMED = {"longest_run_words": "longest_run_tokens"}


def _renamed(fields: dict[str, Any]) -> dict[str, Any]:
    return {_RENAMED.get(k, k): v for k, v in fields.items()}


def decode_draft(raw: bytes) -> FindingDraft:
    return decode_held(raw)[0]


def decode_held(raw: bytes) -> tuple[FindingDraft, bool]:
    """A held item's draft, and whether it is on hold to be judged again (``encode_draft``'s ``judge``)."""
    held = orjson.loads(raw)
    data: dict[str, Any] = _renamed(held["draft"])
    evidence = data.get("evidence")
    if isinstance(evidence, dict) and isinstance(evidence.get("sources"), list):
        data["evidence"] = {
            **evidence,
            "sources": [_renamed(s) if isinstance(s, dict) else s for s in evidence["sources"]],
        }
    values: dict[str, Any] = {
        k: (datetime.fromisoformat(v) if k in _DATETIMES else v) for k, v in data.items() if k in _FIELDS
    }
    values["severity"] = Severity(values["severity"])
    return FindingDraft(**values), held.get("judge") is True


Written = list[tuple[FindingDraft, int, bool]]
Tombstones = Callable[[list[str]], Awaitable[dict[str, float]]]
# Whether a finding on hold still is one (``Matcher.confirm``, wired in service/pipeline.py).
Judge = Callable[[FindingDraft], Awaitable[bool]]


def _tenants(draft: FindingDraft) -> set[str]:
    sources = {s["tenant"] for s in draft.evidence.get("sources", ()) if isinstance(s.get("tenant"), str)}
    return {draft.recipient_tenant, draft.source_tenant} | sources


def without_purged(drafts: list[FindingDraft], tombstones: dict[str, float]) -> list[FindingDraft]:
    """Drafts about responses from after every involved tenant's purge; older ones dropped where the
    purged tenant is recipient or top source, scrubbed of it where it is one more source."""
    out = []
    for draft in drafts:
        at = draft.response_at.timestamp()
        gone = {t for t in _tenants(draft) if t in tombstones and at <= tombstones[t]}
        if not gone:
            out.append(draft)
        elif draft.recipient_tenant not in gone and draft.source_tenant not in gone:
            sources = [s for s in draft.evidence.get("sources", ()) if s.get("tenant") not in gone]
            out.append(dataclasses.replace(draft, evidence={**draft.evidence, "sources": sources}))
        else:
            metrics.FINDINGS_PURGED.inc()
    return out


class FindingsWriter:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        outbox: Outbox,
        tombstones: Tombstones | None = None,
        consumer: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        dead_letter_seconds: float = 7 * 86400.0,
        policy: grouping.Policy | None = None,
        labels: metrics.Labels | None = None,
        hold_seconds: float = 0.0,
        judge: Judge | None = None,
    ):
        self.hold_seconds = hold_seconds if judge is not None else 0.0
        self._judge = judge
        self._dead_letter_seconds = dead_letter_seconds
        self._sessions = sessions
        self._policy = policy or grouping.Policy()  # how findings join incidents, who hears of them
        self._labels = labels or metrics.Labels()  # the caps on the model and node labels
        self.max_attempts = max_attempts
        self._attempts: dict[str, int] = {}  # held item id -> failed writes here; only items this process claimed
        self._outbox = outbox
        self._tombstones = tombstones  # Index.purged: None where no tenant can be purged (tools, tests)
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._loop: Periodic | None = None

    async def write(self, drafts: list[FindingDraft]) -> Written | None:
        """Upsert now, or put on hold; None when the database is down and the drafts were held instead.
        Those raised at once (canaries) go first: holding the others needs Redis, which may fail."""
        drafts = await self._unpurged(drafts)
        later: list[FindingDraft] = []
        now: list[FindingDraft] = []
        for d in drafts:
            (later if self._holds(d) else now).append(d)
        written = await self._write_now(now) if now else []
        if later:
            await self._outbox.hold_until([encode_draft(d, judge=True) for d in later], time.time() + self.hold_seconds)
            metrics.FINDINGS_DEFERRED.inc(len(later))
        return written

    async def _write_now(self, drafts: list[FindingDraft]) -> Written | None:
        try:
            return await self._upsert(drafts)
        except DATABASE_DOWN as exc:
            metrics.BACKEND_ERRORS.labels("database").inc()
            await self._outbox.hold([encode_draft(d) for d in drafts])
            metrics.FINDINGS_HELD.inc(len(drafts))
            log.warning("findings_held", extra={"count": len(drafts), "exc_type": type(exc).__name__})
            return None

    def _holds(self, draft: FindingDraft) -> bool:
        return self.hold_seconds > 0 and draft.response_ref is not None and not draft.canary

    async def _unpurged(self, drafts: list[FindingDraft]) -> list[FindingDraft]:
        if self._tombstones is None or not drafts:
            return drafts
        tombstones = await self._tombstones(sorted(set().union(*(_tenants(d) for d in drafts))))
        return without_purged(drafts, tombstones) if tombstones else drafts

    async def _upsert(self, drafts: list[FindingDraft]) -> Written:
        written: Written = []
        async with session_scope(self._sessions) as session:
            await grouping.lock_groups(session, drafts)
            for draft in drafts:
                stored = await store.upsert(session, draft)
                if stored is not None:
                    finding_id, created = stored
                    written.append((draft, finding_id, created))
                    await grouping.attach(session, finding_id, draft, self._policy)
        for draft, finding_id, new in written:
            if new:
                metrics.record_finding(draft, self._labels)
                log.info("finding_created", extra={"finding_id": finding_id, "severity": draft.severity})
        return written

    async def drain(self) -> int:
        """Write held findings to the database until there are none, or until one fails for another
        reason than an outage (then the next round tries again); how many were written."""
        done = 0
        while True:
            claimed = await self._outbox.claim(self.consumer, CLAIM_COUNT, ABANDONED_SECONDS)
            if not claimed:
                return done
            held: list[tuple[str, bytes, FindingDraft]] = []
            gone = []  # unreadable, or withdrawn after the hold
            for item_id, raw in claimed:
                try:
                    draft, judge = decode_held(raw)
                except (ValueError, TypeError, KeyError) as exc:  # from an incompatible version: say so, once
                    log.error("held_finding_unreadable", extra={"item": item_id, "exc_type": type(exc).__name__})
                    gone.append(item_id)
                    continue
                if judge and not await self._confirmed(draft):
                    gone.append(item_id)
                else:
                    held.append((item_id, raw, draft))
            await self._outbox.release(gone)
            try:
                written = await self._write_held([draft for _, _, draft in held])
            except DATABASE_DOWN:
                raise  # leaves them claimed by us, for the next round
            except Exception:  # one of them, or more, is refused: each alone, so the others are written
                written = 0
                for item_id, raw, draft in held:
                    try:
                        written += await self._write_held([draft])
                    except DATABASE_DOWN:
                        raise
                    except Exception as exc:
                        await self._failed(item_id, raw, exc)
                    else:
                        await self._outbox.release([item_id])
                        self._attempts.pop(item_id, None)
                log.info("held_findings_written", extra={"count": written})
                return done + written
            await self._outbox.release([item_id for item_id, _, _ in held])
            for item_id, _, _ in held:
                self._attempts.pop(item_id, None)
            done += written
            log.info("held_findings_written", extra={"count": written})

    async def _confirmed(self, draft: FindingDraft) -> bool:
        """Judged again after the hold; a withdrawn finding is counted and logged (ids only, no text).
        A judgment that fails (Redis away, a bug) raises the finding as judged the first time: one held
        item that cannot be judged must not hold back the outbox, and a leak detector fails open."""
        if self._judge is None:
            return True
        try:
            if await self._judge(draft):
                return True
        except Exception as exc:
            log.warning("finding_not_judged_again", extra={"key_id": draft.key_id, "exc_type": type(exc).__name__})
            return True
        metrics.FINDINGS_WITHDRAWN.labels(draft.severity).inc()
        log.info(
            "finding_withdrawn",
            extra={"key_id": draft.key_id, "severity": draft.severity, "response_ref": draft.response_ref},
        )
        return False

    async def _write_held(self, drafts: list[FindingDraft]) -> int:
        drafts = await self._unpurged(drafts)  # held before their tenant was purged: not written
        if drafts:
            await self._upsert(drafts)
        return len(drafts)

    async def _failed(self, item_id: str, raw: bytes, exc: Exception) -> None:
        """Count a failed write of one held finding; past ``max_attempts``, move it aside."""
        metrics.FINDINGS_OUTBOX_FAILURES.inc()
        attempts = self._attempts[item_id] = self._attempts.get(item_id, 0) + 1
        if attempts < self.max_attempts:
            log.warning(
                "held_finding_failed", extra={"item": item_id, "attempts": attempts, "exc_type": type(exc).__name__}
            )
            return
        self._attempts.pop(item_id, None)
        await self._outbox.bury(item_id, raw, f"{type(exc).__name__}: {str(exc)[:200]}")
        metrics.FINDINGS_DEAD_LETTERS.inc()
        log.error(
            "held_finding_dead_letter", extra={"item": item_id, "attempts": attempts, "exc_type": type(exc).__name__}
        )

    async def expire_dead(self, now: float) -> int:
        """Delete dead letters older than ``dead_letter_seconds``: kept to be requeued after a fix,
        not forever."""
        expired = await self._outbox.expire_dead(now - self._dead_letter_seconds)
        if expired:
            metrics.DEAD_LETTERS_EXPIRED.labels("findings").inc(expired)
            log.warning("held_findings_dead_letters_expired", extra={"count": expired})
        return expired

    async def tick(self) -> None:
        """One round for ``Periodic``: expire old dead letters; move findings whose hold is over into the
        outbox; export the lengths; write what waits in the outbox."""
        now = time.time()
        await self.expire_dead(now)
        while await self._outbox.move_due(now, CLAIM_COUNT) == CLAIM_COUNT:
            pass
        metrics.FINDINGS_LATER.set(await self._outbox.later_size())
        waiting = await self._outbox.size()
        metrics.FINDINGS_OUTBOX.set(waiting)
        if waiting:
            await self.drain()
            metrics.FINDINGS_OUTBOX.set(await self._outbox.size())

    def start(self, interval_seconds: float = DRAIN_SECONDS) -> None:
        self._loop = Periodic("findings-outbox", self.tick, interval_seconds)
        self._loop.start()

    async def stop(self) -> None:
        if self._loop is not None:
            await self._loop.stop()
            self._loop = None
