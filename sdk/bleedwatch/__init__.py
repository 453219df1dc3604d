"""The bleedwatch gateway SDK: fingerprint exchanges locally, ship only fingerprints to bleedwatch.

Imports numpy, httpx and orjson only, never the server (``service``), so a gateway with its own
top-level ``service`` package, or without FastAPI and SQLAlchemy, can use it.
"""

from bleedwatch.client import BleedwatchClient, Rejected, Undelivered
from bleedwatch.exchange import fingerprint_exchange
from bleedwatch.fingerprint.scheme import Fingerprints, Params, fingerprint_text, key_id
from bleedwatch.spool import Spool

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
