"""Write tests/vectors/fingerprint-bw1.json, the bw1 test vectors of docs/fingerprint-spec.md.

    .venv/bin/python tests/vectors/generate.py

Deterministic: the same implementation, Python and Unicode version give the same bytes. The
values come from the service implementation and are written only if the independent reference
(tests/fingerprint_reference.py) computes exactly the same. The file is pure ASCII (non-ASCII
text is JSON-escaped) so that no editor or tool can silently re-normalise the inputs.

The vectors are frozen: regenerate only for a new scheme version, never to make a failing
test pass. The long vectors take their text from the json module's docstring, which can differ
between Python versions; each vector records its own input, so the file is authoritative.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bleedwatch.fingerprint.encoding import U32_LE, U64_LE, encode  # noqa: E402
from bleedwatch.fingerprint.scheme import (  # noqa: E402
    Params,
    fingerprint_text,
    key_id,
    shingle_hashes,
    token_hashes,
    winnow,
)
from bleedwatch.fingerprint.tokens import normalize, tokenize  # noqa: E402
from tests import fingerprint_reference as ref  # noqa: E402

OUT = Path(__file__).with_name("fingerprint-bw1.json")

KEY = bytes(range(32))  # 00 01 02 ... 1f
KEY_16 = bytes(range(0xA0, 0xB0))  # the shortest key allowed
KEY_64 = bytes(range(64))  # the longest key allowed

DEFAULT = Params(w=5)  # n=4, w=5, sample_after=65536, sample_mod=4 (the vectors were made with w=5)
UNSAMPLED = Params(sample_mod=1)
SMALL = Params(n=2, w=3, sample_after=0, sample_mod=1)
SINGLE = Params(n=1, w=1, sample_after=65_536, sample_mod=1)
SAMPLED = Params(n=4, w=6, sample_after=40, sample_mod=4)
WIDE = Params(n=5, w=8, sample_after=0, sample_mod=2)

SENTENCE = "The quick brown fox jumps over the lazy dog while five boxing wizards jump quickly."


def fullwidth(text: str) -> str:
    """ASCII printable characters as their full-width forms (U+FF01..U+FF5E), space as U+3000."""
    return "".join("\u3000" if c == " " else chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def docstring_words(count: int) -> str:
    doc = json.__doc__ or ""
    return " ".join(doc.split()[:count])


LONG = docstring_words(320)

CASES: list[tuple[str, str, str, bytes, Params]] = [
    ("ascii_sentence", "plain ASCII, several windows", SENTENCE, KEY, DEFAULT),
    (
        "ascii_variants",
        "same tokens as ascii_sentence: case, punctuation, underscores and whitespace differ",
        "  THE Quick, brown-fox; JUMPS over\tthe\r\n\n(lazy) DOG -- while\u00a0FIVE boxing_wizards jump QUICKLY!!!  ",
        KEY,
        DEFAULT,
    ),
    ("fullwidth", "same tokens as ascii_sentence: full-width forms and U+3000", fullwidth(SENTENCE), KEY, DEFAULT),
    (
        "nfkc_compatibility",
        "ligatures, roman numeral, circled digit, squared unit, fraction, superscript, half-width katakana",
        "\ufb01nancial of\ufb01ce \ufb00 \ufb05 \u216b \u2460 \u339e \u00bd x\u00b2 \uff76\uff80\uff76\uff85 \u01c5",
        KEY,
        UNSAMPLED,
    ),
    (
        "german_sharp_s",
        "full case folding: \u00df and U+1E9E fold to ss",
        "Die Stra\u00dfe, die STRASSE und die \u1e9e-Form: Ma\u00df, MASS, ma\u00df.",
        KEY,
        SMALL,
    ),
    (
        "greek_turkish",
        "final sigma folds to sigma; U+0130 folds to i + U+0307 (kept in the word)",
        "\u03a3\u038a\u03a3\u03a5\u03a6\u039f\u03a3 \u03c3\u03af\u03c3\u03c5\u03c6\u03bf\u03c2 "
        "\u03a3\u03af\u03c3\u03c5\u03c6\u03bf\u03c2 \u0130stanbul \u0131s\u0131k",
        KEY,
        SMALL,
    ),
    (
        "cjk_kana",
        "one token per Han/kana character; half-width katakana and a combining voiced mark compose",
        "\u6771\u4eac\u90fd\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002"
        "\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3001\uff76\uff9e\uff77\uff9e \u304b\u3099",
        KEY,
        DEFAULT,
    ),
    (
        "thai",
        "Thai letters, vowel signs, tone marks and digits are each a token",
        "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e44\u0e21\u0e48\u0e21\u0e35\u0e01\u0e32\u0e23"
        "\u0e40\u0e27\u0e49\u0e19\u0e27\u0e23\u0e23\u0e04 \u0e51\u0e52\u0e53",
        KEY,
        DEFAULT,
    ),
    (
        "devanagari",
        "combining marks (matras, virama, nukta) stay in the word; U+0958 decomposes to U+0915 U+093C",
        "\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e \u092e\u0947\u0902 "
        "\u0938\u0902\u092f\u0941\u0915\u094d\u0924\u093e\u0915\u094d\u0937\u0930 \u0939\u094b\u0924\u0947 "
        "\u0939\u0948\u0902\u0964 \u0958\u0932\u092e \u0915\u093c\u0932\u092e",
        KEY,
        SMALL,
    ),
    (
        "astral",
        "U+2000B is solo; mathematical bold/italic fold to ASCII; U+10400 folds to U+10428; emoji is not a token",
        "\U0002000b is U+2000B; \U0001d401\U0001d428\U0001d425\U0001d41d \U0001d456\U0001d461\U0001d44e\U0001d459"
        "\U0001d456\U0001d450 and \U0001f600 emoji \U00010400\U00010401 \U0002a6d6\U0002a6d6",
        KEY,
        SMALL,
    ),
    (
        "boundaries",
        "apostrophe, underscore and full stop split words; a solo character ends a run; marks join a run",
        "don't snake_case 3.14159 e\u0301te\u0301 abc\u65e5\u672cdef x\u00b2+y\u00b2=z\u00b2 na\u00efve \u0149",
        KEY,
        SMALL,
    ),
    ("empty", "no tokens, no fingerprints", "", KEY, DEFAULT),
    (
        "no_tokens",
        "only whitespace, punctuation and symbols",
        "  ... !!! \t \u2014 \u00bf? \u20ac $ \U0001f600 ",
        KEY,
        DEFAULT,
    ),
    ("shorter_than_n", "fewer tokens than n: no shingles", "two words", KEY, DEFAULT),
    ("one_shingle", "exactly n tokens", "one two three four", KEY, DEFAULT),
    (
        "fewer_shingles_than_w",
        "3 shingles, w = 6: the rightmost minimum of all of them",
        "one two three four five six",
        KEY,
        DEFAULT,
    ),
    (
        "repeated_token",
        "all shingle hashes equal: every window keeps its rightmost position",
        "la " * 14,
        KEY,
        DEFAULT,
    ),
    ("n1_w1", "n = 1, w = 1: every token's fmix64 is a fingerprint", SENTENCE, KEY, SINGLE),
    ("n2_w3", "n = 2, w = 3", SENTENCE, KEY, SMALL),
    ("key_16_bytes", "the shortest key", SENTENCE, KEY_16, DEFAULT),
    ("key_64_bytes", "the longest key", SENTENCE, KEY_64, DEFAULT),
    ("long_default", "json module docstring, default parameters (offsets below sample_after)", LONG, KEY, DEFAULT),
    ("long_sampled", "json module docstring, sampling past offset 40 keeps values = 0 mod 4", LONG, KEY, SAMPLED),
    ("long_wide", "json module docstring, n = 5, w = 8, every offset sampled mod 2", LONG, KEY, WIDE),
]


def hex64(values: Any) -> list[str]:
    return [f"{int(v):016x}" for v in values]


def vector(name: str, note: str, text: str, key: bytes, params: Params) -> dict[str, Any]:
    tokens = tokenize(text)
    t = token_hashes(tokens, key)
    h = shingle_hashes(t, params.n)
    winnowed = [int(p) for p in winnow(h, params.w)]
    fp = fingerprint_text(text, key, params)
    out: dict[str, Any] = {
        "name": name,
        "note": note,
        "text": text,
        "key_hex": key.hex(),
        "params": {"n": params.n, "w": params.w, "sample_after": params.sample_after, "sample_mod": params.sample_mod},
        "key_id": key_id(key, params),
        "normalized": normalize(text),
        "tokens": tokens,
        "token_hashes": hex64(t),
        "shingle_hashes": hex64(h),
        "winnowed_offsets": winnowed,
        "offsets": [int(o) for o in fp.offsets],
        "fingerprints": hex64(fp.values),
        "token_count": fp.token_count,
        "wire": {
            "fingerprints": encode(fp.values, U64_LE),
            "offsets": encode(fp.offsets, U32_LE),
            "token_count": fp.token_count,
        },
    }
    check_against_reference(out, key, params)
    return out


def check_against_reference(out: dict[str, Any], key: bytes, params: Params) -> None:
    r = ref.fingerprint(out["text"], key, params.n, params.w, params.sample_after, params.sample_mod)
    expected = {
        "key_id": ref.key_id(key, params.n, params.w),
        "normalized": r.normalized,
        "tokens": r.tokens,
        "token_hashes": hex64(r.token_hashes),
        "shingle_hashes": hex64(r.shingle_hashes),
        "winnowed_offsets": r.winnowed,
        "offsets": r.offsets,
        "fingerprints": hex64(r.values),
        "token_count": len(r.tokens),
        "wire": {
            "fingerprints": ref.encode_u64(r.values),
            "offsets": ref.encode_u32(r.offsets),
            "token_count": len(r.tokens),
        },
    }
    for field, value in expected.items():
        if out[field] != value:
            raise SystemExit(f"{out['name']}: the service and the reference disagree on {field}; not writing")


def render(doc: dict[str, Any]) -> str:
    """JSON with one vector field per line, every value compact: diffable and still plain JSON."""

    def dump(value: Any) -> str:
        return json.dumps(value, ensure_ascii=True, separators=(", ", ": "))

    lines = ["{"]
    for field, value in doc.items():
        if field != "vectors":
            lines.append(f"  {dump(field)}: {dump(value)},")
    lines.append('  "vectors": [')
    for i, vec in enumerate(doc["vectors"]):
        lines.append("    {")
        items = list(vec.items())
        for j, (field, value) in enumerate(items):
            lines.append(f"      {dump(field)}: {dump(value)}{',' if j < len(items) - 1 else ''}")
        lines.append("    }" + ("," if i < len(doc["vectors"]) - 1 else ""))
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def build() -> dict[str, Any]:
    return {
        "scheme": "bw1",
        "spec": "docs/fingerprint-spec.md",
        "generator": "tests/vectors/generate.py",
        "unicode_version": unicodedata.unidata_version,
        "hex": "token_hashes, shingle_hashes and fingerprints are u64 values as 16 lowercase hex digits, "
        "most significant first; key_hex and key_id are byte strings in byte order",
        "vectors": [vector(*case) for case in CASES],
    }


def main() -> None:
    text = render(build())
    json.loads(text)  # still valid JSON
    OUT.write_text(text, encoding="ascii")
    print(f"wrote {OUT.relative_to(ROOT)} ({len(CASES)} vectors, Unicode {unicodedata.unidata_version})")


if __name__ == "__main__":
    main()
