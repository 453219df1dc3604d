"""``bleedwatch allowlist add`` and ``bleedwatch canary probe``: gateway-side helpers.

Both fingerprint locally with the gateway's key and send bleedwatch fingerprints only.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from service.fingerprint.encoding import U32_LE, U64_LE, encode
from service.fingerprint.scheme import DEFAULT_PARAMS, Params, fingerprint_text, key_id

# Allowlisted and canary text is fingerprinted whole: a sampled text's fingerprints are a subset.
UNSAMPLED = Params(n=DEFAULT_PARAMS.n, w=DEFAULT_PARAMS.w, sample_mod=1)


def _check(resp: httpx.Response) -> dict[str, Any]:
    if resp.status_code >= 400:
        try:
            body = resp.json()
            detail = f"{body.get('error')}: {body.get('detail')}"
        except ValueError:
            detail = resp.text[:200]
        raise RuntimeError(f"{resp.request.method} {resp.request.url.path} -> {resp.status_code} {detail}")
    data: dict[str, Any] = resp.json()
    return data


def allowlist_add(
    files: list[Path],
    *,
    url: str,
    api_key: str,
    key: bytes,
    label: str | None,
    n: int = DEFAULT_PARAMS.n,
    w: int = DEFAULT_PARAMS.w,
) -> list[dict[str, Any]]:
    """Allowlist each file's text under the key id of (key, n, w): the gateways' parameters."""
    params = Params(n=n, w=w, sample_mod=1)
    out = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60) as client:
        for path in files:
            fp = fingerprint_text(path.read_text(errors="replace"), key, params)
            body = {
                "key_id": key_id(key, params),
                "label": label or path.name,
                "fingerprints": encode(fp.values, U64_LE),
            }
            out.append(_check(client.post("/v1/allowlist", json=body)))
    return out


def canary_text(tokens: int) -> str:
    """Random six-hex-digit words: each is one token, and no text anywhere shares four in a row."""
    return " ".join(secrets.token_hex(3) for _ in range(tokens))


@dataclass(frozen=True, slots=True)
class ProbeResult:
    canary_id: int
    label: str
    tokens: int
    status: int
    seconds: float


def canary_probe(
    *,
    url: str,
    api_key: str,
    key: bytes,
    tenant: str,
    endpoint: str,
    endpoint_key: str,
    model: str,
    tokens: int,
) -> ProbeResult:
    """Register one canary, then send it as the canary tenant's prompt through the engine.

    Registering first means a leak of the canary is caught even if it happens during the probe.
    The engine's status is reported, not judged: the incident's engine answered 200 to prompts
    it could not hold, which is why the content check exists.
    """
    text = canary_text(tokens)
    fp = fingerprint_text(text, key, UNSAMPLED)
    label = f"probe-{int(time.time())}-{secrets.token_hex(4)}"
    body = {
        "key_id": key_id(key, UNSAMPLED),
        "tenant": tenant,
        "label": label,
        "text": {
            "fingerprints": encode(fp.values, U64_LE),
            "offsets": encode(fp.offsets, U32_LE),
            "token_count": fp.token_count,
        },
    }
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60) as client:
        canary = _check(client.post("/v1/canaries", json=body))
    start = time.perf_counter()
    with httpx.Client(timeout=600) as engine:
        resp = engine.post(
            f"{endpoint.rstrip('/')}/v1/chat/completions",
            headers={"Authorization": f"Bearer {endpoint_key}"},
            json={"model": model, "messages": [{"role": "user", "content": text}], "stream": False},
        )
    return ProbeResult(canary["id"], label, tokens, resp.status_code, time.perf_counter() - start)
