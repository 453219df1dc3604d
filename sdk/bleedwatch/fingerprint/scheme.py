"""Keyed shingle hashing and winnowing: scheme ``bw1`` of docs/fingerprint-spec.md.

Only the gateway holds the key. Every token is hashed with keyed BLAKE2b once (repeated words
hit a per-call cache), the n token hashes of a shingle are combined with a polynomial and a
finaliser in numpy, and winnowing keeps the rightmost minimum of every window of ``w`` shingle
hashes. Any run of ``n + w - 1`` tokens shared by two texts therefore shares a fingerprint
(Schleimer, Wilkerson, Aiken 2003), and the service, which sees only fingerprints, cannot test
a guessed text without the key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from bleedwatch.fingerprint.tokens import utf8_tokens

SCHEME_VERSION = 1
MIN_KEY_BYTES = 16
MAX_KEY_BYTES = 64  # BLAKE2b's own limit for a key

SHINGLE_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
_FMIX_1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX_2 = np.uint64(0xC4CEB9FE1A85EC53)
_SHIFT = np.uint64(33)

U64 = npt.NDArray[np.uint64]
U32 = npt.NDArray[np.uint32]


@dataclass(frozen=True, slots=True)
class Params:
    """What both sides of a comparison must agree on; part of the key id.

    ``sample_after`` and ``sample_mod`` thin out fingerprints past a token offset by keeping
    only those whose value is 0 modulo ``sample_mod``. Which ones survive depends on the
    content, not on chance, so a sampled span still shares a predictable 1/``sample_mod`` of
    its fingerprints with an unsampled copy of the same text elsewhere.

    Responses are winnowed with ``response_w`` (every shingle by default): a response is
    where a leak shows, and with all its shingles the service sees every fingerprint a
    winnowed source kept inside the copy, and can re-winnow the response to check that the
    copy has no holes (docs/detection.md). Prompts, most of the volume, are winnowed with ``w``
    = 3: half their shingles, the trade measured in docs/detection.md. Fingerprints do not
    depend on the window, so texts of any ``w`` compare.
    """

    n: int = 4
    w: int = 3
    sample_after: int = 65_536
    sample_mod: int = 4
    response_w: int = 1

    def __post_init__(self) -> None:
        values = (self.n, self.w, self.sample_after, self.sample_mod, self.response_w)
        if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
            # 4.0 would name another key id ("n=4.0") and travel as 4.0, which the service refuses.
            raise TypeError("n, w, sample_after, sample_mod and response_w must be ints")
        if not 1 <= self.n <= 64:
            raise ValueError("n must be between 1 and 64")
        if not 1 <= self.w <= 256 or not 1 <= self.response_w <= 256:
            raise ValueError("w and response_w must be between 1 and 256")
        if not 0 <= self.sample_after < 2**32 or not 1 <= self.sample_mod < 2**32:
            raise ValueError("sample_after must be in [0, 2**32) and sample_mod in [1, 2**32)")

    def for_response(self) -> Params:
        """The parameters a response is fingerprinted with: ``w`` is ``response_w``."""
        return replace(self, w=self.response_w)

    @property
    def guaranteed_run(self) -> int:
        """Shared runs of at least this many tokens always share a fingerprint."""
        return self.n + self.w - 1


DEFAULT_PARAMS = Params()


@dataclass(frozen=True, slots=True)
class Fingerprints:
    values: U64
    offsets: U32
    token_count: int

    def __len__(self) -> int:
        return len(self.values)


def check_key(key: bytes) -> None:
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"the fingerprint key must be {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes")


def key_from_hex(text: str) -> bytes:
    """The key as operators hold it (hex, in a file or BLEEDWATCH_FINGERPRINT_KEY); a ValueError that
    says which rule it breaks, and never echoes it."""
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError("the fingerprint key must be hex") from None
    check_key(key)
    return key


def key_id(key: bytes, params: Params) -> str:
    """A public name for (key, n, w): fingerprints are only compared under the same key id.

    Sampling and ``response_w`` are not part of it, since fingerprints of any sampling and
    response window stay comparable.
    """
    check_key(key)
    label = f"bleedwatch key-id v{SCHEME_VERSION} n={params.n} w={params.w}".encode()
    return hashlib.blake2b(label, key=key, digest_size=8).hexdigest()


def token_hashes(tokens: Sequence[str], key: bytes) -> U64:
    """Keyed 64-bit hash of each token (little-endian BLAKE2b-64 of its UTF-8)."""
    return utf8_token_hashes([t.encode() for t in tokens], key)


def utf8_token_hashes(tokens: Sequence[bytes], key: bytes) -> U64:
    """:func:`token_hashes` of tokens already in UTF-8, each distinct token hashed once.

    Tokens are numbered by first appearance and the hashes looked up by number in numpy:
    turning a million Python ints above 2**63 into uint64 one by one costs more than the
    hashing does.
    """
    check_key(key)
    blake = hashlib.blake2b
    number = {token: i for i, token in enumerate(dict.fromkeys(tokens))}
    codes = np.fromiter(map(number.__getitem__, tokens), dtype=np.intp, count=len(tokens))
    table = np.fromiter(
        (int.from_bytes(blake(token, key=key, digest_size=8).digest(), "little") for token in number),
        dtype=np.uint64,
        count=len(number),
    )
    return table[codes]


def fmix64(x: U64) -> U64:
    """MurmurHash3's 64-bit finaliser, so low bits are as good as high ones (sampling uses them)."""
    x = x ^ (x >> _SHIFT)
    x = x * _FMIX_1
    x = x ^ (x >> _SHIFT)
    x = x * _FMIX_2
    return x ^ (x >> _SHIFT)


def shingle_hashes(tokens: U64, n: int) -> U64:
    """h[i] = fmix64(sum of tokens[i + j] * M^(n - 1 - j)) mod 2^64, for every n-token shingle."""
    count = len(tokens) - n + 1
    if count <= 0:
        return np.empty(0, dtype=np.uint64)
    with np.errstate(over="ignore"):
        acc = tokens[:count].copy()
        for j in range(1, n):
            acc *= SHINGLE_MULTIPLIER
            acc += tokens[j : j + count]
        return fmix64(acc)


def winnow(hashes: U64, w: int) -> npt.NDArray[np.int64]:
    """Positions of the rightmost minimum of every window of ``w`` hashes, ascending and unique.

    A text shorter than one window keeps the rightmost minimum of all its hashes. One pass per
    window offset, right to left, with a strict comparison so that ties keep the rightmost: w
    vectorised passes instead of an argmin over a strided view, which is ten times slower for
    the small windows the scheme uses. The chosen positions never decrease from one window to
    the next, so duplicates are neighbours and need no sort.
    """
    if len(hashes) == 0:
        return np.empty(0, dtype=np.int64)
    w = min(w, len(hashes))
    count = len(hashes) - w + 1
    best = hashes[w - 1 :].copy()
    shift = np.full(count, w - 1, dtype=np.int64)  # of each window's choice from its start
    for j in range(w - 2, -1, -1):
        candidate = hashes[j : j + count]
        smaller = candidate < best
        np.copyto(best, candidate, where=smaller)
        np.copyto(shift, j, where=smaller)
    chosen = shift + np.arange(count, dtype=np.int64)
    if count == 1:
        return chosen
    return chosen[np.concatenate(([True], chosen[1:] != chosen[:-1]))]


def fingerprint_text(text: str, key: bytes, params: Params = DEFAULT_PARAMS) -> Fingerprints:
    tokens = utf8_tokens(text)
    hashes = shingle_hashes(utf8_token_hashes(tokens, key), params.n)
    positions = winnow(hashes, params.w)
    values = hashes[positions]
    if params.sample_mod > 1:
        keep = (positions < params.sample_after) | (values % np.uint64(params.sample_mod) == 0)
        positions, values = positions[keep], values[keep]
    return Fingerprints(values=values, offsets=positions.astype(np.uint32), token_count=len(tokens))
