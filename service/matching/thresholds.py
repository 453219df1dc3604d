"""The finding rule's thresholds from the configuration, beside the rule that reads them."""

from __future__ import annotations

from service.config import Settings
from service.matching.evidence import Thresholds


def thresholds(settings: Settings) -> Thresholds:
    """The finding rule's thresholds (docs/detection.md)."""
    return Thresholds(
        min_matched=settings.min_matched_fingerprints,
        min_score=settings.min_copy_score,
        high_run_tokens=settings.high_run_tokens,
        critical_run_tokens=settings.critical_run_tokens,
    )
