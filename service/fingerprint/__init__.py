"""Keyed n-gram fingerprints: the only form in which text reaches bleedwatch."""

from service.fingerprint.scheme import Fingerprints, Params, fingerprint_text, key_id
from service.fingerprint.tokens import normalize, tokenize

__all__ = ["Fingerprints", "Params", "fingerprint_text", "key_id", "normalize", "tokenize"]
