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


FORMAT_CHARACTERS = _ranges("Cf")
_CLASS = "\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029" + "".join(
    _escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in FORMAT_CHARACTERS
)
NAME_PATTERN = f"^[^{_CLASS}]+$"  # one or more allowed characters
OPTIONAL_NAME_PATTERN = f"^[^{_CLASS}]*$"  # the same, or empty
DEPLOYMENT_ID_PATTERN = f"^[^{_CLASS}/]+$"  # a path segment: no "/" either
