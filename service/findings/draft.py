"""A finding as matching concludes it, before the database gives it an id.

It is findings' own type, not matching's: the writer, the outbox, metrics and incident grouping
all read it, and none of them should need the matcher to do so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from service.findings.severity import Severity


@dataclass(frozen=True, slots=True)
class FindingDraft:
    key_id: str
    recipient_tenant: str
    recipient_request_id: str
    source_tenant: str
    source_request_ids: list[str]
    response_at: datetime
    model: str
    deployment: str | None
    node: str | None
    prompt_tokens: int | None
    response_tokens: int
    matched_fingerprints: int
    longest_run_tokens: int
    score: float
    severity: Severity
    evidence: dict[str, Any]
    # The response's fingerprints that matched the top source, signed int64 (what a false positive allowlists).
    matched_values: list[int] = field(default_factory=list)
    # The lowest doc ref of the top source's pieces: of two equally strong findings of one response, the
    # one whose source was accepted first is kept (service/findings/store.py), whatever the order of evaluation.
    source_ref: int | None = None
    # The response's doc ref and its tenant's ref in the index: what judging it again after the hold
    # looks up (service/findings/writer.py). Not stored in the database.
    response_ref: int | None = None
    recipient_ref: int | None = None

    @property
    def canary(self) -> bool:
        """A registered canary's text: raised at once, never held (its text must never show anywhere else)."""
        return any(s.get("canary") for s in self.evidence.get("sources", ()) if isinstance(s, dict))
