"""Opaque keyset cursors: ``base64url(kind:json)``, refused with one clear 422 when tampered with."""

from __future__ import annotations

import base64
from typing import Any

import orjson

from service.errors import Invalid

BAD_CURSOR = "cursor: not a cursor returned by this endpoint with these parameters; start again without it"


def encode(kind: str, value: list[Any]) -> str:
    raw = kind.encode() + b":" + orjson.dumps(value)
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(kind: str, cursor: str) -> list[Any]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        prefix, _, body = raw.partition(b":")
        if prefix != kind.encode():
            raise ValueError
        value = orjson.loads(body)
    except (ValueError, orjson.JSONDecodeError):
        raise Invalid(BAD_CURSOR) from None
    if not isinstance(value, list):
        raise Invalid(BAD_CURSOR)
    return value
