"""The bleedwatch gateway SDK: fingerprint exchanges locally, ship only fingerprints to bleedwatch.

Imports numpy, httpx and orjson only, never the server (``service``), so a gateway with its own
top-level ``service`` package, or without FastAPI and SQLAlchemy, can use it.

The names below are loaded on first use (``__getattr__``), not when the package is: every
``bleedwatch.*`` module imports this one first, and the fingerprinting process (``python -m
bleedwatch.worker``) needs numpy and the scheme, not httpx, asyncio and the client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bleedwatch.client import BleedwatchClient, Rejected, Undelivered
    from bleedwatch.exchange import fingerprint_exchange
    from bleedwatch.fingerprint.scheme import Fingerprints, Params, fingerprint_text, key_id
    from bleedwatch.spool import Spool

_MODULES = {
    "BleedwatchClient": "bleedwatch.client",
    "Fingerprints": "bleedwatch.fingerprint.scheme",
    "Params": "bleedwatch.fingerprint.scheme",
    "Rejected": "bleedwatch.client",
    "Spool": "bleedwatch.spool",
    "Undelivered": "bleedwatch.client",
    "fingerprint_exchange": "bleedwatch.exchange",
    "fingerprint_text": "bleedwatch.fingerprint.scheme",
    "key_id": "bleedwatch.fingerprint.scheme",
}

__all__ = [
    "BleedwatchClient",
    "Fingerprints",
    "Params",
    "Rejected",
    "Spool",
    "Undelivered",
    "fingerprint_exchange",
    "fingerprint_text",
    "key_id",
]


def _load(name: str) -> object:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # a module attribute from now on
    return value


if not TYPE_CHECKING:  # mypy reads the imports above, and flags a name that is not there
    __getattr__ = _load


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
