"""The gateway SDK: fingerprint exchanges locally, ship only fingerprints to bleedwatch."""

from service.fingerprint.scheme import Params
from service.sdk.client import BleedwatchClient, Rejected, Undelivered
from service.sdk.exchange import Scalar, fingerprint_exchange, name_problem

__all__ = ["BleedwatchClient", "Params", "Rejected", "Scalar", "Undelivered", "fingerprint_exchange", "name_problem"]
