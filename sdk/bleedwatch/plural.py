"""``counted``: a count and its noun, for what the SDK, the CLI, the API's messages and the webhooks print.

One helper so that no message says "1 findings". It lives in the SDK, which the service imports and
which must not import the service; a module of its own, so that neither side pulls in the client
(httpx) or the responder CLI to use it.
"""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 finding``, ``2,000 findings``; ``plural`` for a noun that takes more than an ``s``
    (``counted(n, "entry", "entries")``). Thousands separated, as the CLI prints large counts."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {plural or noun + 's'}"
