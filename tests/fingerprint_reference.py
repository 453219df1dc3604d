"""A deliberately plain implementation of scheme bw1, written from docs/fingerprint-spec.md alone.

It shares no code with sdk/bleedwatch/fingerprint/: no numpy, no regular expressions, one code point
at a time, integers reduced mod 2**64 by hand. Slow, and meant to be obviously right; the tests
hold it and the service against the same vectors and against each other.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import unicodedata
from dataclasses import dataclass

MASK64 = 2**64 - 1
MULTIPLIER = 0x9E3779B97F4A7C15
FMIX_1 = 0xFF51AFD7ED558CCD
FMIX_2 = 0xC4CEB9FE1A85EC53

# Spec section "Tokenisation": inclusive ranges whose word code points are tokens on their own.
SOLO = [
    (0x0E00, 0x0EFF),
    (0x1000, 0x109F),
    (0x1780, 0x17FF),
    (0x3040, 0x30FF),
    (0x31F0, 0x31FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xF900, 0xFAFF),
    (0x20000, 0x3FFFF),
]


@dataclass(frozen=True)
class Result:
    normalized: str
    tokens: list[str]
    token_hashes: list[int]
    shingle_hashes: list[int]
    winnowed: list[int]
    values: list[int]
    offsets: list[int]


def normalize(text: str) -> str:
    step1 = unicodedata.normalize("NFKC", text)
    step2 = step1.casefold()
    return unicodedata.normalize("NFKC", step2)


def char_class(ch: str) -> str:
    """'solo', 'run' or 'other'."""
    if unicodedata.category(ch)[0] not in ("L", "M", "N"):
        return "other"
    cp = ord(ch)
    for lo, hi in SOLO:
        if lo <= cp <= hi:
            return "solo"
    return "run"


def tokenize(text: str) -> list[str]:
    tokens = []
    current = ""
    for ch in normalize(text):
        kind = char_class(ch)
        if kind == "run":
            current += ch
            continue
        if current:
            tokens.append(current)
            current = ""
        if kind == "solo":
            tokens.append(ch)
    if current:
        tokens.append(current)
    return tokens


def token_hash(token: str, key: bytes) -> int:
    digest = hashlib.blake2b(token.encode("utf-8"), digest_size=8, key=key).digest()
    return int.from_bytes(digest, "little")


def fmix64(x: int) -> int:
    x ^= x >> 33
    x = (x * FMIX_1) & MASK64
    x ^= x >> 33
    x = (x * FMIX_2) & MASK64
    x ^= x >> 33
    return x


def shingle_hash(window: list[int]) -> int:
    n = len(window)
    total = 0
    for j in range(n):
        total += window[j] * pow(MULTIPLIER, n - 1 - j, 2**64)
    return fmix64(total % 2**64)


def winnow(hashes: list[int], w: int) -> list[int]:
    if not hashes:
        return []
    width = min(w, len(hashes))
    chosen = set()
    for start in range(len(hashes) - width + 1):
        best = start
        for i in range(start, start + width):
            if hashes[i] <= hashes[best]:
                best = i
        chosen.add(best)
    return sorted(chosen)


def fingerprint(text: str, key: bytes, n: int, w: int, sample_after: int, sample_mod: int) -> Result:
    assert 16 <= len(key) <= 64
    tokens = tokenize(text)
    t = [token_hash(tok, key) for tok in tokens]
    h = [shingle_hash(t[i : i + n]) for i in range(len(t) - n + 1)]
    winnowed = winnow(h, w)
    offsets = [p for p in winnowed if p < sample_after or h[p] % sample_mod == 0]
    return Result(normalize(text), tokens, t, h, winnowed, [h[p] for p in offsets], offsets)


def key_id(key: bytes, n: int, w: int) -> str:
    assert 16 <= len(key) <= 64
    label = b"bleedwatch key-id v1 n=" + str(n).encode("ascii") + b" w=" + str(w).encode("ascii")
    return hashlib.blake2b(label, digest_size=8, key=key).digest().hex()


def encode_u64(values: list[int]) -> str:
    return base64.b64encode(b"".join(struct.pack("<Q", v) for v in values)).decode("ascii")


def encode_u32(values: list[int]) -> str:
    return base64.b64encode(b"".join(struct.pack("<I", v) for v in values)).decode("ascii")
