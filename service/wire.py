"""Request field types whose validation and OpenAPI schema agree, so the schema is the contract.

They live here, not in ``service/ingest/``, because ingest, canaries, allowlist and auth all read
them: a neutral module lets each import the wire without importing the others.

pydantic's lax mode reads more than the schema says: ``"12"`` or ``true`` for an integer, a
number for a date-time. A client that trusts the schema is fine either way, but the API then
accepts what its document calls invalid (and a fuzzer says so). ``NOT_TEXT`` refuses text and
booleans, and still takes ``1.0``, which JSON Schema counts as an integer. ``Moment`` is ISO 8601
with a timezone, or seconds since the epoch, and its schema says both; the bounds on numbers keep
them seconds (pydantic reads larger ones as milliseconds) and inside what dates can hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import numpy as np
import numpy.typing as npt
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, WithJsonSchema

from bleedwatch.fingerprint.encoding import U32_LE, U64_LE, EncodingError, decode
from bleedwatch.limits import LABEL_MAX_CHARS, LABEL_PATTERN, NAME_MAX_CHARS, NAME_PATTERN, REQUEST_ID_MAX_CHARS
from service.errors import Invalid, PayloadTooLarge
from service.plural import counted

EPOCH_SECONDS_LIMIT = 10**10  # |seconds| below this: years 1653 to 2286, and 16 digits of microseconds (cursors)
MOMENT_SCHEMA = {
    "anyOf": [
        {"type": "string", "format": "date-time"},
        {"type": "number", "exclusiveMinimum": -EPOCH_SECONDS_LIMIT, "exclusiveMaximum": EPOCH_SECONDS_LIMIT},
    ]
}


def _seconds_in_range(value: object) -> object:
    """Numbers (or numeric strings, as in a query, "1e3" too) are read as seconds, refused past the
    limit rather than read as milliseconds; anything else is left for pydantic's date-time parser."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return value
    try:
        seconds = float(value)
    except ValueError:
        return value  # a date-time string
    if not -EPOCH_SECONDS_LIMIT < seconds < EPOCH_SECONDS_LIMIT:  # NaN fails too
        raise ValueError(f"give epoch seconds within ±{EPOCH_SECONDS_LIMIT}, or an ISO 8601 time with a timezone")
    return seconds


EARLIEST = datetime.fromtimestamp(1 - EPOCH_SECONDS_LIMIT, UTC)
LATEST = datetime.fromtimestamp(EPOCH_SECONDS_LIMIT - 1, UTC)


def _utc(value: datetime) -> datetime | None:
    """The time in UTC (a naive one read as UTC), as the database stores it; None where Python can
    hold no such time (year 1 at +01:00, 9999 at -01:00)."""
    try:
        return value.astimezone(UTC) if value.tzinfo is not None else value.replace(tzinfo=UTC)
    except OverflowError:
        return None


def _time_in_range(value: datetime) -> datetime:
    """A date-time string as far out as numbers may go."""
    utc = _utc(value)
    if utc is None or not -EPOCH_SECONDS_LIMIT < utc.timestamp() < EPOCH_SECONDS_LIMIT:
        raise ValueError("give a time between the years 1653 and 2286")
    return value


Moment = Annotated[
    datetime, BeforeValidator(_seconds_in_range), AfterValidator(_time_in_range), WithJsonSchema(MOMENT_SCHEMA)
]


def _bound_in_range(value: datetime) -> datetime:
    """A filter's bound beyond what a stored time can be (a ``Moment``) is the nearest one that can:
    it selects the same rows, and the schema's date-times (years 0 to 9999) all pass. Naive stays
    naive, for the route to refuse."""
    utc = _utc(value) or (EARLIEST if value.year < 5000 else LATEST)
    utc = min(max(utc, EARLIEST), LATEST)
    return utc if value.tzinfo is not None else utc.replace(tzinfo=None)


# since/until of a listing.
Bound = Annotated[
    datetime, BeforeValidator(_seconds_in_range), AfterValidator(_bound_in_range), WithJsonSchema(MOMENT_SCHEMA)
]


def _not_text(value: object) -> object:
    if isinstance(value, str | bool):
        raise ValueError("give a JSON integer, not a string or a boolean")
    return value


# Put it after the bounds, ``Annotated[int, Field(ge=0), NOT_TEXT]``: bounds given after a validator
# come out in the schema as pydantic's names ("ge"), which JSON Schema does not know.
NOT_TEXT = BeforeValidator(_not_text)


Name = Annotated[str, StringConstraints(min_length=1, max_length=NAME_MAX_CHARS, pattern=NAME_PATTERN)]
RequestId = Annotated[str, StringConstraints(min_length=1, max_length=REQUEST_ID_MAX_CHARS, pattern=NAME_PATTERN)]
Label = Annotated[str, StringConstraints(max_length=LABEL_MAX_CHARS, pattern=LABEL_PATTERN)]
KeyId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
# Integer fields take JSON integers only (NOT_TEXT above), so "12" and true are refused, not coerced.
U64_MAX = 2**64 - 1


class Text(BaseModel):
    """Fingerprints of one text: base64 of little-endian u64/u32 arrays, or JSON integer arrays."""

    model_config = ConfigDict(extra="forbid")

    fingerprints: str | list[Annotated[int, Field(ge=0, le=U64_MAX), NOT_TEXT]]
    offsets: str | list[Annotated[int, Field(ge=0, lt=2**32), NOT_TEXT]]
    token_count: Annotated[int, Field(ge=0, lt=2**32), NOT_TEXT]


@dataclass(frozen=True, slots=True)
class Decoded:
    values: npt.NDArray[np.uint64]
    offsets: npt.NDArray[np.uint32]
    token_count: int


def decode_array(
    value: str | list[int], dtype: np.dtype[np.unsignedinteger], where: str
) -> npt.NDArray[np.unsignedinteger]:
    if isinstance(value, list):
        return np.array(value, dtype=dtype.newbyteorder("="))
    try:
        return decode(value, dtype)
    except EncodingError as exc:
        raise Invalid(f"{where} {exc}") from None


def decode_text(text: Text, where: str, max_fingerprints: int) -> Decoded:
    """Arrays checked for what pydantic cannot see: size, pairing, order. The cap is a plain int so
    callers outside ingest (canaries) need not build ingest's ``Limits``."""
    values = decode_array(text.fingerprints, U64_LE, f"{where}.fingerprints").astype(np.uint64)
    offsets = decode_array(text.offsets, U32_LE, f"{where}.offsets").astype(np.uint32)
    if len(values) > max_fingerprints:
        raise PayloadTooLarge(
            f"{where}.fingerprints: {len(values)} fingerprints, more than the limit of {max_fingerprints} "
            "(BLEEDWATCH_MAX_FINGERPRINTS_PER_TEXT); enable sampling in the SDK for long texts"
        )
    if len(values) != len(offsets):
        raise Invalid(
            f"{where}: {counted(len(values), 'fingerprint')} but {counted(len(offsets), 'offset')}; they must pair up"
        )
    if len(offsets) and int(offsets[-1]) >= max(text.token_count, 1):
        raise Invalid(f"{where}.offsets: an offset is not below token_count ({text.token_count})")
    if len(offsets) > 1 and not bool(np.all(offsets[1:] > offsets[:-1])):
        raise Invalid(f"{where}.offsets: offsets must be strictly increasing, as winnowing produces them")
    return Decoded(values, offsets, text.token_count)
