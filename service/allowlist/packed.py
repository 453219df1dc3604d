"""Sets of fingerprints as sorted, distinct uint64 arrays, and their stored form: little-endian bytes.

8 bytes a fingerprint wherever a set is held (a replica's memory, a table row, a request), and
membership is a binary search. Shared by the service (store, loader) and the gateway-side
upload, which must agree on what "already there" means.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from bleedwatch.fingerprint.encoding import U64_LE

U64 = npt.NDArray[np.uint64]


def pack(sorted_values: U64) -> bytes:
    return np.ascontiguousarray(sorted_values, dtype=U64_LE).tobytes()


def unpack(data: bytes) -> U64:
    return np.frombuffer(data, dtype=U64_LE).astype(np.uint64, copy=False)


def sorted_unique(parts: Sequence[U64]) -> U64:
    """The distinct values of ``parts``, sorted; one copy of them at a time besides the result."""
    if not parts:
        return np.empty(0, dtype=np.uint64)
    values = np.concatenate(parts).astype(np.uint64, copy=False)
    values.sort()
    if len(values) < 2:
        return values
    keep = np.empty(len(values), dtype=np.bool_)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def without(values: U64, sorted_sets: Iterable[U64]) -> U64:
    """``values`` less those in any of ``sorted_sets`` (each sorted), in their order."""
    for stored in sorted_sets:
        if len(values) == 0:
            break
        if len(stored):
            pos = np.minimum(np.searchsorted(stored, values), len(stored) - 1)
            values = values[stored[pos] != values]
    return values
