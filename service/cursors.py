"""Keyset cursors: short strings whose every form the OpenAPI document describes exactly.

A cursor is the position after the last row of a page: a row id (``ID_PATTERN``), or a sort key
and a row id (``KEY_ID_PATTERN``: an integer, which for a time is microseconds since the epoch).
Every string its pattern admits is a position, so any cursor that passes the schema gets a page
(perhaps empty), never an error: clients and fuzzers can trust the schema, and a cursor carries
nothing a caller could not see in the page it came from. Anything else is refused by the schema
(422) before the route runs.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

ID_PATTERN = r"^[0-9]{1,18}$"  # below 2**63, a row id
KEY_ID_PATTERN = r"^-?[0-9]{1,16}\.[0-9]{1,18}$"  # a sort key (|key| < 10**16), then a row id
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


def encode_id(row_id: int) -> str:
    return str(row_id)


def decode_id(cursor: str) -> int:
    return int(cursor)


def encode_key_id(key: int | datetime, row_id: int) -> str:
    value = (key - EPOCH) // MICROSECOND if isinstance(key, datetime) else key
    return f"{value}.{row_id}"


def decode_key_id(cursor: str) -> tuple[int, int]:
    key, _, row_id = cursor.partition(".")
    return int(key), int(row_id)


def to_time(micros: int) -> datetime:
    """A sort key as a time (any 16-digit value is a valid one: years 1653 to 2286)."""
    return EPOCH + micros * MICROSECOND
