"""Request field types whose validation and OpenAPI schema agree, so the schema is the contract.

They live here, not in ``service/ingest/``, because ingest, canaries, allowlist and auth all read
them: a neutral module lets each import the wire without importing the others.

pydantic's lax mode reads more than the schema says: ``"12"`` or ``true`` for an integer, a
number for a date-time. A client that trusts the schema is fine either way, but the API then
accepts what its document calls invalid (and a fuzzer says so). ``NOT_TEXT`` refuses text and
booleans, and still takes ``1.0``, which JSON Schema counts as an integer. ``STRICT_INT``, for what
gateways and engines send (exchanges, signals) and for allowlisted fingerprints, refuses ``1.0``
too: there it is a client's bug (a count computed as a float; a u64 fingerprint as a float has lost
its low bits already), and those operations answer 422 for rules their schema cannot say anyway
(tests/schemathesis.toml).
``Moment`` is ISO 8601 with a timezone, or seconds since the epoch as a JSON number, and its
schema says both; a numeric string is neither (a query's ``Bound``, all text, takes one). The
bounds on numbers keep them seconds (pydantic reads larger ones as milliseconds) and inside what
dates can hold.

The ingest queue holds bodies as accepted, and nothing after acceptance refuses an exchange: it
reads them under ``QUEUED``, which still takes what the wire took before it was strict.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import numpy as np
import numpy.typing as npt
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
)

from bleedwatch.fingerprint.encoding import U32_LE, U64_LE, EncodingError, decode
from bleedwatch.limits import LABEL_MAX_CHARS, LABEL_PATTERN, NAME_MAX_CHARS, NAME_PATTERN, REQUEST_ID_MAX_CHARS
from bleedwatch.plural import counted
from service.errors import Invalid, PayloadTooLarge

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


# The validation context of queue items (see above): ``Model.model_validate_json(body, context=QUEUED)``.
QUEUED = {"queued": True}


def _queued(info: ValidationInfo) -> bool:
    return isinstance(info.context, dict) and info.context.get("queued") is True


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _body_seconds(value: object, info: ValidationInfo) -> object:
    """A body's time: seconds as a JSON number, as its schema says; ``"1700000000"`` is a client's
    bug, not a date-time."""
    if isinstance(value, str) and _numeric(value) and not _queued(info):
        raise ValueError("give epoch seconds as a JSON number, not a string, or an ISO 8601 time with a timezone")
    return _seconds_in_range(value)


Moment = Annotated[
    datetime, BeforeValidator(_body_seconds), AfterValidator(_time_in_range), WithJsonSchema(MOMENT_SCHEMA)
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


def _strict_int(value: object, info: ValidationInfo) -> object:
    if isinstance(value, str | bool) or (isinstance(value, float) and not _queued(info)):
        raise ValueError('give a JSON integer such as 12, not "12", 12.0, 1.2e1 or true')
    return value


# Put them after the bounds, ``Annotated[int, Field(ge=0), NOT_TEXT]``: bounds given after a validator
# come out in the schema as pydantic's names ("ge"), which JSON Schema does not know.
NOT_TEXT = BeforeValidator(_not_text)
STRICT_INT = BeforeValidator(_strict_int)


Name = Annotated[str, StringConstraints(min_length=1, max_length=NAME_MAX_CHARS, pattern=NAME_PATTERN)]
RequestId = Annotated[str, StringConstraints(min_length=1, max_length=REQUEST_ID_MAX_CHARS, pattern=NAME_PATTERN)]
Label = Annotated[str, StringConstraints(max_length=LABEL_MAX_CHARS, pattern=LABEL_PATTERN)]
KeyId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
# Integer fields take JSON integers only (NOT_TEXT, STRICT_INT above), so "12" and true are refused, not coerced.
U64_MAX = 2**64 - 1


class Text(BaseModel):
    """Fingerprints of one text: base64 of little-endian u64/u32 arrays, or JSON integer arrays.
    Integers are written as such: 12, not 12.0."""

    model_config = ConfigDict(extra="forbid")

    fingerprints: str | list[Annotated[int, Field(ge=0, le=U64_MAX), STRICT_INT]]
    offsets: str | list[Annotated[int, Field(ge=0, lt=2**32), STRICT_INT]]
    token_count: Annotated[int, Field(ge=0, lt=2**32), STRICT_INT]


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
