"""``bleedwatch allowlist add``, ``allowlist import-public`` and ``canary probe``: gateway-side helpers.

All fingerprint locally with the gateway's key and send bleedwatch fingerprints only.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bleedwatch.fingerprint.encoding import U32_LE, U64_LE, encode
from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS, Params, fingerprint_text, key_id
from service.allowlist import public
from service.allowlist.packed import sorted_unique
from service.allowlist.upload import EntryUpload, blocks, check, every_shingle, text_files

# Canary text is fingerprinted whole: a sampled text's fingerprints are a subset.
UNSAMPLED = Params(n=DEFAULT_PARAMS.n, w=DEFAULT_PARAMS.w, sample_mod=1)


@dataclass(frozen=True, slots=True)
class AllowlistResult:
    entry: dict[str, Any] | None  # None: nothing to allowlist (every text too short), or nothing new
    texts: int
    fingerprints: int  # distinct fingerprints of the texts
    sent: int  # ... of which sent in this run
    seconds: float


def _client(url: str, api_key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=120)


def _label(paths: list[Path]) -> str:
    names = [p.name or str(p) for p in paths]
    label = names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more"
    return label[:256]


def allowlist_add(
    paths: list[Path],
    *,
    url: str,
    api_key: str,
    key: bytes,
    label: str | None,
    n: int = DEFAULT_PARAMS.n,
    w: int = DEFAULT_PARAMS.w,
) -> AllowlistResult:
    """Allowlist the text of files and directories (recursively) as one entry, for gateways using (n, w)."""
    start = time.perf_counter()
    with _client(url, api_key) as client:
        upload = EntryUpload(client, key, Params(n=n, w=w), label or _label(paths))
        for path in text_files(paths):
            for piece in blocks(path):
                upload.add(piece)
        entry = upload.finish()
    return AllowlistResult(entry, upload.texts, upload.sent, upload.sent, time.perf_counter() - start)


def import_public(
    *,
    url: str,
    api_key: str,
    key: bytes,
    n: int = DEFAULT_PARAMS.n,
    w: int = DEFAULT_PARAMS.w,
    bundle: public.Bundle | None = None,
) -> AllowlistResult:
    """Allowlist the public-text bundle (service/allowlist/public.py) once per bundle version and key id.

    An unrevoked entry with the bundle's label and as many fingerprints as the bundle gives is
    left alone; one with fewer (an import cut short) is completed, since bleedwatch keeps only
    the values an entry lacks. Raises ``public.BundleMissing`` if the bundle is not installed.
    The entry is looked up before the bundle is fingerprinted (half a minute), so a wrong URL or
    key fails at once.
    """
    start = time.perf_counter()
    b = bundle or public.bundle()
    gateway = Params(n=n, w=w)
    with _client(url, api_key) as client:
        params = {"key_id": key_id(key, gateway), "label": b.label}
        found = [e for e in check(client.get("/v1/allowlist", params=params))["items"] if e["revoked_at"] is None]
        entry = found[-1] if found else None  # the oldest: listed newest first
        parts = [fingerprint_text(t.text, key, every_shingle(gateway)).values for t in b.texts()]
        texts, values = len(parts), sorted_unique(parts)
        if entry is not None and entry["fingerprint_count"] == len(values):
            return AllowlistResult(entry, texts, len(values), 0, time.perf_counter() - start)
        upload = EntryUpload(client, key, gateway, b.label, entry=entry)
        upload.add_values(values)
        entry = upload.finish()
    return AllowlistResult(entry, texts, len(values), upload.sent, time.perf_counter() - start)


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
        canary = check(client.post("/v1/canaries", json=body))
    start = time.perf_counter()
    with httpx.Client(timeout=600) as engine:
        resp = engine.post(
            f"{endpoint.rstrip('/')}/v1/chat/completions",
            headers={"Authorization": f"Bearer {endpoint_key}"},
            json={"model": model, "messages": [{"role": "user", "content": text}], "stream": False},
        )
    return ProbeResult(canary["id"], label, tokens, resp.status_code, time.perf_counter() - start)
