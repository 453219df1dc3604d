"""The gateway side: raw text in, the wire form of one exchange out. Text never leaves here."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from service.fingerprint.encoding import U32_LE, U64_LE, encode
from service.fingerprint.scheme import (
    DEFAULT_PARAMS,
    SCHEME_VERSION,
    Fingerprints,
    Params,
    fingerprint_text,
    key_id,
)

Scalar = str | int | float | bool | None


def _text(fp: Fingerprints) -> dict[str, Any]:
    return {
        "fingerprints": encode(fp.values, U64_LE),
        "offsets": encode(fp.offsets, U32_LE),
        "token_count": fp.token_count,
    }


def fingerprint_exchange(
    prompt: str,
    response: str,
    *,
    key: bytes,
    tenant: str,
    request_id: str,
    model: str,
    ts: float | datetime | None = None,
    meta: dict[str, Scalar] | None = None,
    params: Params = DEFAULT_PARAMS,
) -> dict[str, Any]:
    """One element of ``POST /v1/exchanges``'s ``exchanges`` list.

    ``meta`` should carry ``deployment``, ``node`` and the engine's ``prompt_tokens`` where
    the gateway knows them: they are what a responder needs to scope a leak.
    """
    when = ts if isinstance(ts, datetime) else datetime.fromtimestamp(time.time() if ts is None else ts, UTC)
    return {
        "tenant": tenant,
        "request_id": request_id,
        "model": model,
        "ts": when.isoformat(),
        "key_id": key_id(key, params),
        "scheme": {
            "version": SCHEME_VERSION,
            "n": params.n,
            "w": params.w,
            "sample_after": params.sample_after,
            "sample_mod": params.sample_mod,
            "response_w": params.response_w,
        },
        "prompt": _text(fingerprint_text(prompt, key, params)),
        "response": _text(fingerprint_text(response, key, params.for_response())),
        "meta": dict(meta or {}),
    }
