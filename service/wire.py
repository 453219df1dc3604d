"""Request field types whose validation and OpenAPI schema agree, so the schema is the contract.

pydantic's lax mode reads more than the schema says: ``"12"`` or ``true`` for an integer, a
number for a date-time. A client that trusts the schema is fine either way, but the API then
accepts what its document calls invalid (and a fuzzer says so). ``NOT_TEXT`` refuses text and
booleans, and still takes ``1.0``, which JSON Schema counts as an integer. ``Moment`` is ISO 8601
with a timezone, or seconds since the epoch, and its schema says both; the bounds on numbers keep
them seconds (pydantic reads larger ones as milliseconds) and inside what dates can hold.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BeforeValidator, WithJsonSchema

EPOCH_SECONDS_LIMIT = 10**10  # |seconds| below this: years 1653 to 2286
MOMENT_SCHEMA = {
    "anyOf": [
        {"type": "string", "format": "date-time"},
        {"type": "number", "minimum": -EPOCH_SECONDS_LIMIT, "maximum": EPOCH_SECONDS_LIMIT},
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
    if not -EPOCH_SECONDS_LIMIT <= seconds <= EPOCH_SECONDS_LIMIT:  # NaN fails too
        raise ValueError(f"give epoch seconds within ±{EPOCH_SECONDS_LIMIT}, or an ISO 8601 time with a timezone")
    return seconds


Moment = Annotated[datetime, BeforeValidator(_seconds_in_range), WithJsonSchema(MOMENT_SCHEMA)]


def _not_text(value: object) -> object:
    if isinstance(value, str | bool):
        raise ValueError("give a JSON integer, not a string or a boolean")
    return value


# Put it after the bounds, ``Annotated[int, Field(ge=0), NOT_TEXT]``: bounds given after a validator
# come out in the schema as pydantic's names ("ge"), which JSON Schema does not know.
NOT_TEXT = BeforeValidator(_not_text)
