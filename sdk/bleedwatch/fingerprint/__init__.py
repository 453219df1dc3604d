"""Keyed n-gram fingerprints: the only form in which text reaches bleedwatch."""

from bleedwatch.fingerprint.scheme import Fingerprints, Params, fingerprint_text, key_id
from bleedwatch.fingerprint.tokens import normalize, tokenize

__all__ = ["Fingerprints", "Params", "fingerprint_text", "key_id", "normalize", "tokenize"]
