"""Turn a validated batch into arrays, checking what pydantic cannot: sizes and consistency.

Errors name the field (``exchanges[3].prompt.offsets``) and the rule, never the values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from service.errors import Invalid, PayloadTooLarge, problem
from service.ingest.schemas import Batch, Exchange
from service.wire import Decoded, decode_text

_exchange = TypeAdapter(Exchange)


@dataclass(frozen=True, slots=True)
class Limits:
    max_exchanges: int
    max_fingerprints: int
    max_future_seconds: int
    max_age_seconds: int | None = None  # BLEEDWATCH_MAX_AGE_SECONDS (default: the findings retention)
    accepted_key_ids: frozenset[str] = frozenset()  # BLEEDWATCH_ACCEPTED_KEY_IDS; empty = any
    new_tenants_per_minute: int = 0  # BLEEDWATCH_NEW_TENANTS_PER_KEY_PER_MINUTE; 0 = no limit


def check_batch(batch: Batch, limits: Limits, now: float) -> None:
    """A whole batch: its size, then each exchange (``check_exchange``), then no repeats within it."""
    check_size(len(batch.exchanges), limits)
    seen: set[tuple[str, str]] = set()
    for i, ex in enumerate(batch.exchanges):
        key = (ex.tenant, ex.request_id)
        if key in seen:
            raise Invalid(f"exchanges[{i}]: request_id repeats an earlier exchange of the same tenant in this batch")
        seen.add(key)
        check_exchange(ex, i, limits, now)


def check_size(exchanges: int, limits: Limits) -> None:
    """How many exchanges one body may carry: more refuses the whole batch (split it)."""
    if exchanges > limits.max_exchanges:
        raise PayloadTooLarge(
            f"exchanges: {exchanges} in one batch, more than the limit of {limits.max_exchanges} "
            "(BLEEDWATCH_MAX_BATCH_EXCHANGES); split the batch"
        )


def parse_exchange(raw: dict[str, Any], i: int) -> Exchange:
    """One exchange of a batch as received; ``Invalid`` naming its fields (never their values)."""
    try:
        return _exchange.validate_python(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)[:10]
        raise Invalid("; ".join(problem(err, f"exchanges[{i}]") for err in errors)) from None


def check_exchange(ex: Exchange, i: int, limits: Limits, now: float) -> None:
    """What the schema cannot say about one exchange: its time, its key id, its extra meta fields."""
    if ex.ts.tzinfo is None:
        raise Invalid(f"exchanges[{i}].ts: give a timezone (e.g. 2026-12-02T10:00:00Z) or epoch seconds")
    if ex.ts.timestamp() > now + limits.max_future_seconds:
        raise Invalid(
            f"exchanges[{i}].ts: more than {limits.max_future_seconds} s in the future; check the gateway clock"
        )
    if limits.max_age_seconds is not None and ex.ts.timestamp() < now - limits.max_age_seconds:
        raise Invalid(
            f"exchanges[{i}].ts: more than {limits.max_age_seconds} s in the past (BLEEDWATCH_MAX_AGE_SECONDS); "
            "check the gateway clock, or drop exchanges that old"
        )
    if limits.accepted_key_ids and ex.key_id not in limits.accepted_key_ids:
        raise Invalid(
            f"exchanges[{i}].key_id: not one of the fingerprint key ids this service accepts "
            "(BLEEDWATCH_ACCEPTED_KEY_IDS); check the gateway's fingerprint key"
        )


def decode_exchange(ex: Exchange, i: int, limits: Limits) -> tuple[Decoded, Decoded]:
    return (
        decode_text(ex.prompt, f"exchanges[{i}].prompt", limits.max_fingerprints),
        decode_text(ex.response, f"exchanges[{i}].response", limits.max_fingerprints),
    )
