"""How bad a finding is, in one place: matching decides it, metrics label by it, incidents rank by
it, paging filters on it, the API and the UI show it.

A ``StrEnum`` so the value is the word everywhere it is stored or sent (database, JSON, metric
labels): nothing on the wire changes.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args


class Severity(StrEnum):
    LOW = "low"
    HIGH = "high"
    CRITICAL = "critical"


# Higher is worse: an incident takes its worst finding's; paging's min_severity compares by it.
# Keyed by the enum, and found by the plain word as well (a StrEnum hashes as its value).
SEVERITY_RANK: dict[str, int] = {Severity.LOW: 1, Severity.HIGH: 2, Severity.CRITICAL: 3}

# For API models and query parameters: the same three words as a Literal, so the OpenAPI document
# keeps the inline enum it had (a StrEnum there becomes a new named schema). Checked equal here.
SeverityField = Literal["low", "high", "critical"]
assert set(get_args(SeverityField)) == set(Severity), "SeverityField and Severity must list the same words"
