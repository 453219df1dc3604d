"""What names may hold: tenants, models, deployments, nodes, keys, labels, request ids.

No control characters (Unicode Cc), no line or paragraph separators (Zl, Zp: line breaks in many
log viewers and editors, as a newline is) and no format characters (Cf: zero-width spaces and joiners,
bidirectional overrides, the byte-order mark, tag characters). Format characters are invisible:
``acme`` and ``ac<U+200B>me`` look the same in a log, a dashboard or a CSV, and a bidi override
makes a name read differently from what it is, so an operator could be shown a tenant that is
not the one stored. Refused in the schema pattern itself, so the OpenAPI document says so.

The pattern is written with ``\\uXXXX`` and ``\\UXXXXXXXX`` escapes, which Python's ``re``, the
Rust regex engine pydantic uses, and the fuzzer's generator all read the same way.
"""

from __future__ import annotations

import sys
import unicodedata
from typing import TYPE_CHECKING

# What the patterns refuse, as General Categories: Cc is exactly \x00-\x1f and \x7f-\x9f, Zl is U+2028
# and Zp U+2029 (tests/test_sdk_imports.py checks that both agree on every code point).
FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})

# Built on first use (``_build``, the module's ``__getattr__``): listing the format characters takes
# a scan of every code point, a quarter of a second. The service's schemas read them as they load;
# the SDK checks names with ``forbidden`` and never builds them, so neither ``import bleedwatch``
# nor the fingerprinting process (``python -m bleedwatch.worker``) pays for them.
FORMAT_CHARACTERS: list[tuple[int, int]]  # Cf, as inclusive ranges
NAME_PATTERN: str  # one or more allowed characters
OPTIONAL_NAME_PATTERN: str  # the same, or empty
DEPLOYMENT_ID_PATTERN: str  # a path segment: no "/" either
_BUILT = ("FORMAT_CHARACTERS", "NAME_PATTERN", "OPTIONAL_NAME_PATTERN", "DEPLOYMENT_ID_PATTERN")


def forbidden(text: str) -> bool:
    """Whether ``text`` holds a character the patterns refuse: their answer, a character at a time,
    without the table they are built from."""
    return not FORBIDDEN_CATEGORIES.isdisjoint(map(unicodedata.category, text))


def _ranges(category: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for code in range(sys.maxunicode + 1):
        if unicodedata.category(chr(code)) == category:
            if out and out[-1][1] == code - 1:
                out[-1] = (out[-1][0], code)
            else:
                out.append((code, code))
    return out


def _escape(code: int) -> str:
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _build(name: str) -> object:
    if name not in _BUILT:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    format_characters = _ranges("Cf")
    forbidden_class = "\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029" + "".join(
        _escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in format_characters
    )
    built = {
        "FORMAT_CHARACTERS": format_characters,
        "NAME_PATTERN": f"^[^{forbidden_class}]+$",
        "OPTIONAL_NAME_PATTERN": f"^[^{forbidden_class}]*$",
        "DEPLOYMENT_ID_PATTERN": f"^[^{forbidden_class}/]+$",
    }
    globals().update(built)  # module attributes from now on: this runs once
    return built[name]


if not TYPE_CHECKING:  # mypy reads the annotations above, and flags a name that is not there
    __getattr__ = _build
