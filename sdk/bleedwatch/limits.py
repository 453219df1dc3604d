"""The limits of ``POST /v1/exchanges`` that the service enforces and the SDK checks before sending.

Defined once here, in the SDK, and imported by the service: a gateway never learns a limit from a
refusal, because the client drops and counts an exchange the service would reject before it
travels and never builds a body the service would refuse. This module imports only
``bleedwatch.names``, so it costs a gateway nothing of the server, and reads its patterns only
when asked for them (the SDK checks names with ``bleedwatch.names.forbidden``, without them).
The ``DEFAULT_`` sizes are settings on the service (BLEEDWATCH_MAX_*); a gateway talking to a
service configured otherwise passes the same values to ``BleedwatchClient``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bleedwatch import names

NAME_MAX_CHARS = 128  # exchanges[].tenant
REQUEST_ID_MAX_CHARS = 256  # exchanges[].request_id
LABEL_MAX_CHARS = 256  # model, meta labels and meta string values
# Names and labels: no control or format characters (sdk/bleedwatch/names.py says why, and why
# these are built on first use).
NAME_PATTERN: str  # names.NAME_PATTERN
LABEL_PATTERN: str  # names.OPTIONAL_NAME_PATTERN: a label may be empty

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024  # BLEEDWATCH_MAX_BODY_BYTES
DEFAULT_MAX_BATCH_EXCHANGES = 1000  # BLEEDWATCH_MAX_BATCH_EXCHANGES
DEFAULT_MAX_FINGERPRINTS_PER_TEXT = 500_000  # BLEEDWATCH_MAX_FINGERPRINTS_PER_TEXT


def _pattern(name: str) -> str:
    if name == "NAME_PATTERN":
        return names.NAME_PATTERN
    if name == "LABEL_PATTERN":
        return names.OPTIONAL_NAME_PATTERN
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if not TYPE_CHECKING:  # mypy reads the annotations above, and flags a name that is not there
    __getattr__ = _pattern
