"""The gateway SDK: fingerprint exchanges locally, ship only fingerprints to bleedwatch."""

from service.fingerprint.scheme import Params
from service.sdk.client import BleedwatchClient, Rejected, Undelivered
from service.sdk.exchange import fingerprint_exchange

__all__ = ["BleedwatchClient", "Params", "Rejected", "Undelivered", "fingerprint_exchange"]
