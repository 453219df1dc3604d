"""``counted``: a count and its noun, for what the CLI, the API's messages and the webhooks print.

One helper so that no message says "1 findings"; a module of its own so that the retention,
queue and ingest code need not import the responder CLI (and httpx) to use it.
"""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 finding``, ``2,000 findings``; ``plural`` for a noun that takes more than an ``s``
    (``counted(n, "entry", "entries")``). Thousands separated, as the CLI prints large counts."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {plural or noun + 's'}"
