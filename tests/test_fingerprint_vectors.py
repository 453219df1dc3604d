"""Scheme bw1 against its test vectors, and the service against an independent reference.

The vectors (tests/vectors/fingerprint-bw1.json) are what a Go or Rust gateway is checked
against. Both the service implementation and tests/fingerprint_reference.py, written from
docs/fingerprint-spec.md, must reproduce every field of every vector exactly.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bleedwatch.exchange import fingerprint_exchange
from bleedwatch.fingerprint.encoding import U32_LE, U64_LE, decode, encode
from bleedwatch.fingerprint.scheme import (
    SCHEME_VERSION,
    Params,
    fingerprint_text,
    key_id,
    shingle_hashes,
    token_hashes,
    winnow,
)
from bleedwatch.fingerprint.tokens import _token_patterns, normalize, tokenize, utf8_tokens
from tests import fingerprint_reference as ref

VECTOR_FILE = Path(__file__).parent / "vectors" / "fingerprint-bw1.json"
DOC: dict[str, Any] = json.loads(VECTOR_FILE.read_text(encoding="ascii"))
VECTORS: list[dict[str, Any]] = DOC["vectors"]
IDS = [v["name"] for v in VECTORS]
FIELDS = [
    "name",
    "note",
    "text",
    "key_hex",
    "params",
    "key_id",
    "normalized",
    "tokens",
    "token_hashes",
    "shingle_hashes",
    "winnowed_offsets",
    "offsets",
    "fingerprints",
    "token_count",
    "wire",
]


def hex64(values: Any) -> list[str]:
    return [f"{int(v):016x}" for v in values]


def unpack(vec: dict[str, Any]) -> tuple[str, bytes, Params]:
    return vec["text"], bytes.fromhex(vec["key_hex"]), Params(**vec["params"])


def test_vector_file_shape() -> None:
    assert DOC["scheme"] == f"bw{SCHEME_VERSION}"
    assert DOC["unicode_version"] == "14.0.0"
    assert len(set(IDS)) == len(IDS)
    for vec in VECTORS:
        assert list(vec) == FIELDS, vec["name"]
        assert len(vec["token_hashes"]) == vec["token_count"] == len(vec["tokens"])
        assert len(vec["shingle_hashes"]) == max(0, vec["token_count"] - vec["params"]["n"] + 1)
        assert set(vec["offsets"]) <= set(vec["winnowed_offsets"])
    # the cases the spec promises are there
    assert {v["params"]["sample_mod"] for v in VECTORS} >= {1, 2, 4}
    assert {len(v["key_hex"]) // 2 for v in VECTORS} == {16, 32, 64}
    assert any(len(v["offsets"]) < len(v["winnowed_offsets"]) for v in VECTORS), "sampling is exercised"
    assert any(0 < len(v["shingle_hashes"]) < v["params"]["w"] for v in VECTORS)
    assert any(v["token_count"] >= 300 for v in VECTORS)


@pytest.mark.parametrize("vec", VECTORS, ids=IDS)
def test_service_reproduces_vector(vec: dict[str, Any]) -> None:
    text, key, params = unpack(vec)
    assert normalize(text) == vec["normalized"]
    tokens = tokenize(text)
    assert tokens == vec["tokens"]
    t = token_hashes(tokens, key)
    assert hex64(t) == vec["token_hashes"]
    h = shingle_hashes(t, params.n)
    assert hex64(h) == vec["shingle_hashes"]
    assert winnow(h, params.w).tolist() == vec["winnowed_offsets"]

    fp = fingerprint_text(text, key, params)
    assert fp.values.dtype == np.uint64
    assert fp.offsets.dtype == np.uint32
    assert fp.offsets.tolist() == vec["offsets"]
    assert hex64(fp.values) == vec["fingerprints"]
    assert fp.token_count == vec["token_count"]
    assert key_id(key, params) == vec["key_id"]
    assert encode(fp.values, U64_LE) == vec["wire"]["fingerprints"]
    assert encode(fp.offsets, U32_LE) == vec["wire"]["offsets"]

    exchange = fingerprint_exchange(
        text, text, key=key, tenant="acme", request_id="r-1", model="m", ts=0.0, params=params
    )
    assert exchange["key_id"] == vec["key_id"]
    assert exchange["prompt"] == vec["wire"]
    every = fingerprint_text(text, key, replace(params, w=params.response_w))  # a response keeps every shingle
    assert exchange["response"]["fingerprints"] == encode(every.values, U64_LE)
    assert exchange["scheme"]["response_w"] == 1

    assert decode(vec["wire"]["fingerprints"], U64_LE).tolist() == [int(x, 16) for x in vec["fingerprints"]]
    assert decode(vec["wire"]["offsets"], U32_LE).tolist() == vec["offsets"]


@pytest.mark.parametrize("vec", VECTORS, ids=IDS)
def test_reference_reproduces_vector(vec: dict[str, Any]) -> None:
    text, key, p = vec["text"], bytes.fromhex(vec["key_hex"]), vec["params"]
    r = ref.fingerprint(text, key, p["n"], p["w"], p["sample_after"], p["sample_mod"])
    assert r.normalized == vec["normalized"]
    assert r.tokens == vec["tokens"]
    assert hex64(r.token_hashes) == vec["token_hashes"]
    assert hex64(r.shingle_hashes) == vec["shingle_hashes"]
    assert r.winnowed == vec["winnowed_offsets"]
    assert r.offsets == vec["offsets"]
    assert hex64(r.values) == vec["fingerprints"]
    assert len(r.tokens) == vec["token_count"]
    assert ref.key_id(key, p["n"], p["w"]) == vec["key_id"]
    assert ref.encode_u64(r.values) == vec["wire"]["fingerprints"]
    assert ref.encode_u32(r.offsets) == vec["wire"]["offsets"]


def test_spec_examples() -> None:
    """The worked examples quoted in docs/fingerprint-spec.md."""
    key = bytes(range(32))
    assert ref.token_hash("the", key) == 0x771438EDFF34C2EC
    assert ref.key_id(key, 4, 6) == "95db50d0887f2295"
    assert ref.encode_u64([0x0814C07B13DC03C2, 0x114F69B5CC9ADE82]) == "wgPcE3vAFAiC3prMtWlPEQ=="
    assert ref.encode_u32([5, 7]) == "BQAAAAcAAAA="
    assert ref.fmix64(0) == 0


def _all_code_points() -> list[str]:
    return [chr(cp) for cp in range(sys.maxunicode + 1) if not 0xD800 <= cp <= 0xDFFF]


def test_character_classes_agree_on_every_code_point() -> None:
    """The service's compiled patterns classify every code point as the spec's table does."""
    fast, full = _token_patterns()

    def service_class(pattern: Any, ch: str) -> str:
        if pattern.fullmatch(ch) is None:
            return "other"
        return "run" if pattern.fullmatch(ch + ch) else "solo"

    wrong = []
    for ch in _all_code_points():
        expected = ref.char_class(ch)
        got = service_class(full, ch)
        if ord(ch) < 0x10000 and service_class(fast, ch) != got:
            wrong.append((f"U+{ord(ch):04X}", "fast/full", got))
        if got != expected:
            wrong.append((f"U+{ord(ch):04X}", got, expected))
    assert wrong == []


def test_tokens_agree_on_every_code_point() -> None:
    text = " ".join(_all_code_points())
    tokens = ref.tokenize(text)
    assert tokenize(text) == tokens
    assert utf8_tokens(text) == [t.encode() for t in tokens]
    glued = "".join(_all_code_points())  # no spaces: pieces of ASCII and non-ASCII side by side
    assert utf8_tokens(glued) == [t.encode() for t in ref.tokenize(glued)]


def test_a_lone_surrogate_separates_words_and_does_not_stop_fingerprinting() -> None:
    """JSON lets a caller put one in a prompt; if it raised, that exchange would go unchecked."""
    key = bytes(range(32))
    text = "the patient record of john doe \ud83d ssn 123 45 6789 follows here"
    assert utf8_tokens(text) == [t.encode() for t in ref.tokenize(text)]
    plain = fingerprint_text(text.replace("\ud83d", " "), key, Params())
    assert fingerprint_text(text, key, Params()).values.tolist() == plain.values.tolist()


# Characters where implementations tend to go wrong, mixed into otherwise random text.
TRICKY = [
    *"aZ9 \t\n.,'_-",
    *"\u00df\u1e9e\u0130\u0131\u03c2\u03a3\u0345\u0149\u01c5",  # case folding
    *"\u0301\u0308\u093c\u0958\u094d\u0e48\u0e35\u3099\u309a",  # combining marks
    *"\uff21\uff41\uff10\uff76\uff9e\ufb01\ufb05\u2460\u00bd\u00b2\u216b\u339e\u00a0\u3000",  # NFKC
    *"\u4e00\u3042\u30ab\u0e01\u1000\u1780\uf900\u3400\u2044",  # solo ranges
    *"\U00020000\U0002000b\U0002a6d6\U0003134a\U00031350\U0001d401\U00010400\U0001f600\U000e0041",  # astral
    "\uab70",  # Cherokee small letter: folds to the capital
    *"\ud83d\udc00",  # lone surrogates (JSON lets a caller send them): not word characters, not an error
]
TEXT = st.one_of(
    st.text(max_size=80),
    st.text(st.sampled_from(TRICKY), max_size=80),
    st.text(st.one_of(st.sampled_from(TRICKY), st.characters()), max_size=120),
    st.lists(st.sampled_from(["alpha", "beta", "gamma", "\u65e5", "\u00df", "x"]), max_size=40).map(" ".join),
)


@settings(max_examples=200, deadline=None)
@given(
    text=TEXT,
    key=st.binary(min_size=16, max_size=64),
    n=st.integers(1, 6),
    w=st.integers(1, 10),
    sample_after=st.integers(0, 20),
    sample_mod=st.integers(1, 4),
)
def test_reference_and_service_agree(text: str, key: bytes, n: int, w: int, sample_after: int, sample_mod: int) -> None:
    params = Params(n=n, w=w, sample_after=sample_after, sample_mod=sample_mod)
    r = ref.fingerprint(text, key, n, w, sample_after, sample_mod)
    assert normalize(text) == r.normalized
    assert tokenize(text) == r.tokens
    assert utf8_tokens(text) == [t.encode() for t in r.tokens]
    fp = fingerprint_text(text, key, params)
    assert fp.offsets.tolist() == r.offsets
    assert fp.values.tolist() == r.values
    assert fp.token_count == len(r.tokens)
    assert encode(fp.values, U64_LE) == ref.encode_u64(r.values)
    assert encode(fp.offsets, U32_LE) == ref.encode_u32(r.offsets)
    assert key_id(key, params) == ref.key_id(key, n, w)
