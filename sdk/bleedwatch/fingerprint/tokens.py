"""Normalisation and tokenisation, the part of the scheme that decides what counts as "the same text".

Both sides of a leak must produce the same tokens for the same words whatever the casing, width,
punctuation or spacing, so normalisation is NFKC, full case folding, NFKC again. Words are runs
of letters, digits and combining marks; scripts written without spaces (Han, kana, Thai, Lao,
Khmer, Myanmar) give one token per character so a leaked Japanese sentence still shingles.

The character classes are built once from ``unicodedata`` into a single ``re`` pattern: the
tokeniser then runs in C, which is what lets the SDK reach millions of tokens per second.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import numpy.typing as npt

# Scripts written without spaces between words: every letter, digit or mark in these ranges is
# a token on its own. Inclusive code point ranges; kept in step with docs/fingerprint-spec.md.
SOLO_RANGES: tuple[tuple[int, int], ...] = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x31F0, 0x31FF),  # Katakana phonetic extensions
    (0x3400, 0x4DBF),  # CJK unified ideographs extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0x20000, 0x3FFFF),  # CJK extensions B onwards (planes 2 and 3)
)

UNICODE_VERSION = unicodedata.unidata_version


def _ranges(mask: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate(([False], mask, [False])).astype(np.int8)))
    return [(int(lo), int(hi) - 1) for lo, hi in zip(edges[::2], edges[1::2], strict=True)]


def _mask(chars: str, test: Callable[[str], bool]) -> npt.NDArray[np.bool_]:
    return np.frombuffer(bytes(map(test, chars)), dtype=np.bool_)


def _word_code_points() -> npt.NDArray[np.bool_]:
    """Which code points are word characters (General Category L, M or N), as ``unicodedata`` says.

    Asking ``unicodedata.category`` about each of the 1.1 million code points in a Python loop
    cost every new fingerprinting process (``python -m bleedwatch.worker``) about 0.2 s on its first
    non-ASCII text. Two ``str`` predicates, defined by General Category in Python's documentation
    and run by ``map`` in C, settle all but about 13,000 of them exactly: a code point that is not
    ``isprintable`` is of category C or Z (not a word character), and a printable one that
    ``isalpha`` is of category L. Only the printable non-letters (M, N, P, S and the space) are
    asked their category. The predicates are generated from the same Unicode database as
    ``unicodedata`` in every CPython build, so the classes follow the interpreter's Unicode version
    as before.
    """
    count = sys.maxunicode + 1
    codes = np.arange(count, dtype="<u4")
    printable = codes[_mask(codes.tobytes().decode("utf-32-le", "surrogatepass"), str.isprintable)]
    alpha = _mask(printable.tobytes().decode("utf-32-le"), str.isalpha)  # surrogates are not printable
    word = np.zeros(count, dtype=np.bool_)
    word[printable[alpha]] = True
    rest = printable[~alpha]
    category = unicodedata.category
    word[rest] = [category(chr(cp))[0] in "NM" for cp in rest.tolist()]
    return word


def _char_class(ranges: list[tuple[int, int]]) -> str:
    def esc(cp: int) -> str:
        return f"\\U{cp:08x}"

    return "".join(esc(lo) if lo == hi else f"{esc(lo)}-{esc(hi)}" for lo, hi in ranges)


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


@lru_cache(maxsize=1)
def _token_patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """Two equivalent tokenisers: one for text within the Basic Multilingual Plane, one for all.

    ``re`` matches a class of BMP ranges with a bitmap but scans astral ranges one by one,
    which is ten times slower, so the full pattern is kept for text that needs it.
    """
    count = sys.maxunicode + 1
    word = _word_code_points()
    solo = np.zeros(count, dtype=bool)
    for lo, hi in SOLO_RANGES:
        solo[lo : hi + 1] = True
    bmp = np.arange(count) < 0x10000
    solo_bmp = _char_class(_ranges(word & solo & bmp))
    run_bmp = _char_class(_ranges(word & ~solo & bmp))
    solo_astral = _char_class(_ranges(word & solo & ~bmp))
    run_astral = _char_class(_ranges(word & ~solo & ~bmp))
    fast = re.compile(f"[{solo_bmp}]|[{run_bmp}]+")
    full = re.compile(f"[{solo_bmp}]|[{solo_astral}]|(?:[{run_bmp}]|[{run_astral}])+")
    return fast, full


def normalize(text: str) -> str:
    """NFKC, full case folding, NFKC: folding can leave text that is no longer NFKC."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def tokenize(text: str) -> list[str]:
    """The tokens of ``text`` after normalisation, in order."""
    fast, full = _token_patterns()
    normal = normalize(text)
    return (full if _ASTRAL.search(normal) else fast).findall(normal)


# ASCII letters and digits are the only ASCII word characters; every other ASCII byte ends a token.
_ASCII_SPLIT = bytes(c if chr(c).isascii() and chr(c).isalnum() else 0x20 for c in range(128)) + bytes(range(128, 256))


_NON_ASCII = re.compile(rb"[\x80-\xff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8_tokens(text: str) -> list[bytes]:
    """``[t.encode() for t in tokenize(text)]``, twice as fast on mostly-ASCII text.

    No token crosses an ASCII character that is not a letter or digit, so the UTF-8 bytes are
    cut there with ``bytes.translate`` and ``split`` (both in C, no per-character regex step),
    and only the pieces that hold non-ASCII characters go through the tokeniser's pattern.
    UTF-8 encodes non-ASCII characters with bytes >= 0x80 only, so the cut never splits one.
    """
    normal = normalize(text)
    try:
        data = normal.encode()
    except UnicodeEncodeError:  # a lone surrogate (JSON lets a caller send one): no word character (spec §1)
        data = _SURROGATE.sub(" ", normal).encode()
    cut = data.translate(_ASCII_SPLIT)
    if _NON_ASCII.search(cut) is None:
        return cut.split()
    fast, full = _token_patterns()
    tokens: list[bytes] = []
    done = 0
    while (found := _NON_ASCII.search(cut, done)) is not None:
        start = cut.rfind(b" ", done, found.start()) + 1
        end = cut.find(b" ", found.end())
        end = len(cut) if end < 0 else end
        tokens += cut[done:start].split()
        piece = cut[start:end].decode()
        tokens += (t.encode() for t in (full if _ASTRAL.search(piece) else fast).findall(piece))
        done = end
    tokens += cut[done:].split()
    return tokens
