"""Properties of scheme bw1 that docs/fingerprint-spec.md promises, checked with hypothesis.

The winnowing guarantee, the normalisation invariances, and the wire decoders' contract: any
input either decodes or raises EncodingError, encoding round-trips, and errors never echo input.
"""

from __future__ import annotations

import base64
import re
import string

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bleedwatch.fingerprint.encoding import U32_LE, U64_LE, EncodingError, decode, encode
from bleedwatch.fingerprint.scheme import Fingerprints, Params, fingerprint_text
from bleedwatch.fingerprint.tokens import tokenize

KEY = bytes(range(32))

# A small vocabulary makes repeated tokens and equal shingles (the tie rule) common.
WORD = st.one_of(
    st.sampled_from(["a", "b", "c"]),
    st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=6),
)
WORDS = st.lists(WORD, max_size=30)


def fingerprints(tokens: list[str], params: Params) -> Fingerprints:
    text = " ".join(tokens)
    assert tokenize(text) == tokens
    return fingerprint_text(text, KEY, params)


# (a) the winnowing guarantee


@pytest.mark.parametrize(("n", "w"), [(1, 1), (2, 3), (4, 6), (3, 12), (7, 2)])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_shared_run_of_n_plus_w_minus_1_tokens_shares_a_fingerprint(n: int, w: int, data: st.DataObject) -> None:
    length = data.draw(st.integers(n + w - 1, n + w + 15), label="run length")
    run = data.draw(st.lists(WORD, min_size=length, max_size=length), label="run")
    a_before, a_after, b_before, b_after = (data.draw(WORDS, label=side) for side in ("a<", "a>", "b<", "b>"))
    params = Params(n=n, w=w, sample_mod=1)
    fa = fingerprints(a_before + run + a_after, params)
    fb = fingerprints(b_before + run + b_after, params)

    # Some window lies wholly inside the run in both texts, and both select the same shingle of it.
    def inside(fp: Fingerprints, start: int) -> dict[int, int]:
        return {
            int(o) - start: int(v)
            for o, v in zip(fp.offsets, fp.values, strict=True)
            if start <= o <= start + length - n
        }

    in_a, in_b = inside(fa, len(a_before)), inside(fb, len(b_before))
    assert any(in_b.get(rel) == value for rel, value in in_a.items())


@settings(max_examples=100, deadline=None)
@given(
    tokens=st.lists(WORD, max_size=120),
    n=st.integers(1, 5),
    w=st.integers(1, 8),
    sample_after=st.integers(0, 60),
    sample_mod=st.integers(2, 5),
)
def test_sampling_keeps_a_content_defined_subset(
    tokens: list[str], n: int, w: int, sample_after: int, sample_mod: int
) -> None:
    full = fingerprints(tokens, Params(n=n, w=w, sample_mod=1))
    sampled = fingerprints(tokens, Params(n=n, w=w, sample_after=sample_after, sample_mod=sample_mod))
    expected = [
        (int(o), int(v))
        for o, v in zip(full.offsets, full.values, strict=True)
        if o < sample_after or int(v) % sample_mod == 0
    ]
    assert list(zip(sampled.offsets.tolist(), sampled.values.tolist(), strict=True)) == expected
    assert sampled.token_count == full.token_count


# (b) normalisation invariances

ASCII_WORD = st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=8)
WHITESPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\u00a0\u2003\u2028\u2029\u3000"
SEPARATOR = st.text(alphabet=WHITESPACE + string.punctuation, min_size=1, max_size=4)
EDGE = st.text(alphabet=WHITESPACE + string.punctuation, max_size=3)
SMALL = Params(n=2, w=3, sample_mod=1)


def same(a: str, b: str, params: Params = SMALL) -> None:
    fa, fb = fingerprint_text(a, KEY, params), fingerprint_text(b, KEY, params)
    assert fa.values.tolist() == fb.values.tolist()
    assert fa.offsets.tolist() == fb.offsets.tolist()
    assert fa.token_count == fb.token_count


def fullwidth(text: str) -> str:
    return "".join("\u3000" if c == " " else chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


@settings(max_examples=150, deadline=None)
@given(words=st.lists(ASCII_WORD, max_size=25), data=st.data())
def test_case_whitespace_and_punctuation_do_not_matter(words: list[str], data: st.DataObject) -> None:
    plain = " ".join(words)
    variant = data.draw(EDGE, label="leading")
    for i, word in enumerate(words):
        if i:
            variant += data.draw(SEPARATOR, label="separator")
        flips = data.draw(st.lists(st.booleans(), min_size=len(word), max_size=len(word)), label="case flips")
        variant += "".join(c.swapcase() if flip else c for c, flip in zip(word, flips, strict=True))
    variant += data.draw(EDGE, label="trailing")
    same(plain, variant)
    same(plain, plain.upper(), Params())
    same(plain, plain.lower(), Params())


@settings(max_examples=100, deadline=None)
@given(words=st.lists(ASCII_WORD, max_size=25))
def test_fullwidth_ascii_equals_ascii(words: list[str]) -> None:
    plain = " ".join(words)
    same(plain, fullwidth(plain))
    same(plain, fullwidth(plain.swapcase()), Params())


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("die Stra\u00dfe ist lang", "DIE STRASSE IST LANG"),
        ("die \u1e9e ist gross", "die ss ist gro\u00df"),
        (
            "\u03c3\u03af\u03c3\u03c5\u03c6\u03bf\u03c2 \u03ba\u03b1\u03b9",
            "\u03a3\u038a\u03a3\u03a5\u03a6\u039f\u03a3 \u039a\u0391\u0399",
        ),
        ("\ufb01nal of\ufb01ce \ufb00 ok", "final office ff ok"),
        ("caf\u00e9 na\u00efve r\u00e9sum\u00e9 x", "cafe\u0301 nai\u0308ve re\u0301sume\u0301 x"),
        ("\uff76\uff9e\uff77\uff9e\uff78\uff9e", "\u30ac\u30ae\u30b0"),
        ("\U0001d401\U0001d428\U0001d425\U0001d41d text here", "bold TEXT here"),
    ],
)
def test_unicode_equivalents(a: str, b: str) -> None:
    same(a, b)


# (c) the wire decoders

B64 = string.ascii_letters + string.digits + "+/"
DTYPES = st.sampled_from([U64_LE, U32_LE])
INVALID = re.compile(r"is not valid standard base64 \(RFC 4648, with padding\)")
SIZE = re.compile(r"decodes to \d+ bytes, not a multiple of (8|4) \(little-endian (64|32)-bit integers\)")


def expected_values(raw: bytes, size: int) -> list[int]:
    return [int.from_bytes(raw[i : i + size], "little") for i in range(0, len(raw), size)]


@settings(max_examples=300, deadline=None)
@given(
    text=st.one_of(
        st.text(),
        st.text(alphabet=B64 + "=", max_size=40),
        st.binary(max_size=40).map(lambda raw: raw.decode("latin-1")),
        st.binary(max_size=40).map(lambda raw: base64.b64encode(raw).decode()),
    ),
    dtype=DTYPES,
)
def test_any_string_decodes_or_raises_encoding_error(text: str, dtype: np.dtype[np.unsignedinteger]) -> None:
    message = None
    try:
        values = decode(text, dtype)
    except EncodingError as exc:  # the only exception allowed
        message = str(exc)
    if message is not None:
        assert INVALID.fullmatch(message) or SIZE.fullmatch(message), message
        return
    raw = base64.b64decode(text, validate=True)
    assert values.dtype == dtype.newbyteorder("=")
    assert values.tolist() == expected_values(raw, dtype.itemsize)


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=80), dtype=DTYPES)
def test_base64_of_any_bytes_decodes_exactly_when_the_length_fits(
    raw: bytes, dtype: np.dtype[np.unsignedinteger]
) -> None:
    text = base64.b64encode(raw).decode()
    if len(raw) % dtype.itemsize == 0:
        assert decode(text, dtype).tolist() == expected_values(raw, dtype.itemsize)
        return
    with pytest.raises(EncodingError) as info:
        decode(text, dtype)
    message = str(info.value)
    assert SIZE.fullmatch(message)
    assert f" {len(raw)} bytes" in message
    if len(raw) >= 9:  # 12+ base64 characters: could not occur in a message by chance
        assert text not in message


@settings(max_examples=200, deadline=None)
@given(
    raw=st.binary(min_size=12, max_size=60),
    bad=st.sampled_from([" ", "\n", "\t", "-", "_", ".", "!", "*", "~", "\u00e9", "\u20ac", "\x00", "\U0001f600"]),
    where=st.integers(0, 200),
    dtype=DTYPES,
)
def test_invalid_base64_is_rejected_without_echoing_it(
    raw: bytes, bad: str, where: int, dtype: np.dtype[np.unsignedinteger]
) -> None:
    valid = base64.b64encode(raw).decode()
    where = where % (len(valid) + 1)
    text = valid[:where] + bad + valid[where:]
    with pytest.raises(EncodingError) as info:
        decode(text, dtype)
    assert INVALID.fullmatch(str(info.value))
    assert text not in str(info.value)


@pytest.mark.parametrize("text", ["QQ", "QQ=", "QQ===", "=QQ=", "QQ==QQ==", "QUFB\nQUFB", "QUFB QUFB"])
def test_bad_padding_and_whitespace_are_rejected(text: str) -> None:
    with pytest.raises(EncodingError, match=INVALID.pattern):
        decode(text, U64_LE)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(0, 2**64 - 1), max_size=50))
def test_uint64_round_trip(values: list[int]) -> None:
    array = np.array(values, dtype=np.uint64)
    text = encode(array, U64_LE)
    assert text == base64.b64encode(b"".join(v.to_bytes(8, "little") for v in values)).decode()
    back = decode(text, U64_LE)
    assert back.dtype == np.uint64
    assert back.tolist() == values


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(0, 2**32 - 1), max_size=50))
def test_uint32_round_trip(values: list[int]) -> None:
    array = np.array(values, dtype=np.uint32)
    text = encode(array, U32_LE)
    assert text == base64.b64encode(b"".join(v.to_bytes(4, "little") for v in values)).decode()
    back = decode(text, U32_LE)
    assert back.dtype == np.uint32
    assert back.tolist() == values
