"""The gateway side: raw text in, the wire form of one exchange out. Text never leaves here."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from bleedwatch.fingerprint.encoding import U32_LE, U64_LE, encode
from bleedwatch.fingerprint.scheme import (
    DEFAULT_PARAMS,
    SCHEME_VERSION,
    Fingerprints,
    Params,
    fingerprint_text,
    key_id,
)
from bleedwatch.limits import LABEL_MAX_CHARS, NAME_MAX_CHARS, REQUEST_ID_MAX_CHARS
from bleedwatch.names import forbidden

Scalar = str | int | float | bool | None
Texts = tuple[dict[str, Any], dict[str, Any]]  # the prompt's and the response's fingerprints, wire form

_NAMES = (("tenant", NAME_MAX_CHARS), ("request_id", REQUEST_ID_MAX_CHARS), ("model", LABEL_MAX_CHARS))
_LISTED_META = {"deployment", "node", "end_user"}  # labels; prompt_tokens is a count
# What an exchange's JSON holds besides its fingerprints, names and meta (keys, scheme, ts, key id, counts), at most.
_FIXED_BYTES = 1024
_JSON_ESCAPE = 6  # a character takes at most 6 bytes in JSON (\uXXXX)
_DIGITS_U64 = 21  # a u64 in a JSON list, with its comma


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
    when = time.time() if ts is None else ts
    texts = fingerprint_texts(prompt, response, key, params)
    return exchange_of(
        texts, key=key, tenant=tenant, request_id=request_id, model=model, ts=when, meta=meta, params=params
    )


def fingerprint_texts(prompt: str, response: str, key: bytes, params: Params = DEFAULT_PARAMS) -> Texts:
    """The prompt's and the response's fingerprints in the wire form: all of an exchange's work, and all
    of its text. What the client's fingerprinting process computes (sdk/bleedwatch/worker.py)."""
    return _text(fingerprint_text(prompt, key, params)), _text(fingerprint_text(response, key, params.for_response()))


def exchange_of(
    texts: Texts,
    *,
    key: bytes,
    tenant: str,
    request_id: str,
    model: str,
    ts: float | datetime,
    meta: dict[str, Scalar] | None,
    params: Params,
) -> dict[str, Any]:
    """The exchange around the fingerprints of ``fingerprint_texts``: names, time, key id and scheme."""
    when = ts if isinstance(ts, datetime) else datetime.fromtimestamp(ts, UTC)
    prompt, response = texts
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
        "prompt": prompt,
        "response": response,
        "meta": dict(meta or {}),
    }


def name_problem(exchange: Mapping[str, Any]) -> str | None:
    """Why the service would reject this exchange for its names or meta, as a drop reason
    (``invalid:<field>``); None when they are fine. The same limits as the service's, from
    sdk/bleedwatch/limits.py, so a name the service refuses never travels. Characters are checked with
    ``names.forbidden``, which answers as the service's patterns do without building them."""
    for field, max_chars in _NAMES:
        value = exchange.get(field)
        if not isinstance(value, str) or not value or len(value) > max_chars or forbidden(value):
            return f"invalid:{field}"
    meta = exchange.get("meta") or {}
    if not isinstance(meta, Mapping):
        return "invalid:meta"
    for name, value in meta.items():
        if name not in _LISTED_META and name != "prompt_tokens":
            return "invalid:meta"  # listed fields only: free-form ones could carry raw text
        if value is None:
            continue
        if name == "prompt_tokens":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32:
                return "invalid:meta"
        elif not (isinstance(value, str) and len(value) <= LABEL_MAX_CHARS and not forbidden(value)):
            return "invalid:meta"
    return None


def fingerprint_count(text: Mapping[str, Any]) -> int:
    """Fingerprints of one text of the wire form (base64 of u64s, or a JSON list), without decoding them."""
    values = text.get("fingerprints")
    if isinstance(values, str):
        return (len(values) // 4 * 3 - values[-2:].count("=")) // 8
    return len(values) if isinstance(values, list) else 0


def wire_size(exchange: Mapping[str, Any]) -> int:
    """An upper bound of the bytes this exchange takes in a batch's JSON body, without encoding it:
    what the client cuts batches by, so that no body passes the service's limit."""
    size = _FIXED_BYTES
    for kind in ("prompt", "response"):
        text = exchange.get(kind) or {}
        for field in ("fingerprints", "offsets"):
            value = text.get(field)
            size += len(value) if isinstance(value, str) else _DIGITS_U64 * len(value or ())
    for field, _ in _NAMES:
        size += _JSON_ESCAPE * len(str(exchange.get(field) or ""))
    for name, value in (exchange.get("meta") or {}).items():
        size += _JSON_ESCAPE * (len(str(name)) + len(str(value))) + 8
    return size


def size_problem(exchange: Mapping[str, Any], max_fingerprints_per_text: int, max_body_bytes: int) -> str | None:
    """Why the service would refuse this exchange for its size (``too_large:<what>``), or None."""
    for kind in ("prompt", "response"):
        text = exchange.get(kind)
        if isinstance(text, Mapping) and fingerprint_count(text) > max_fingerprints_per_text:
            return f"too_large:{kind}"
    if wire_size(exchange) + len('{"exchanges":[]}') > max_body_bytes:
        return "too_large:exchange"
    return None
