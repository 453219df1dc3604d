"""The compact wire form of fingerprint arrays: standard padded base64 of little-endian integers.

A 1M-token prompt has tens of thousands of fingerprints; as JSON numbers that is several times
the bytes and an order of magnitude more parse time than one base64 string.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np
import numpy.typing as npt

U64_LE = np.dtype("<u8")
U32_LE = np.dtype("<u4")


class EncodingError(ValueError):
    """The value is not a valid encoding; the message says why without echoing it."""


def encode(values: npt.NDArray[np.unsignedinteger], dtype: np.dtype[np.unsignedinteger]) -> str:
    return base64.b64encode(np.ascontiguousarray(values, dtype=dtype).tobytes()).decode("ascii")


def decode(text: str, dtype: np.dtype[np.unsignedinteger]) -> npt.NDArray[np.unsignedinteger]:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise EncodingError("is not valid standard base64 (RFC 4648, with padding)") from None
    if len(raw) % dtype.itemsize:
        raise EncodingError(
            f"decodes to {len(raw)} bytes, not a multiple of {dtype.itemsize} "
            f"(little-endian {8 * dtype.itemsize}-bit integers)"
        )
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))


def to_signed(values: npt.NDArray[np.uint64]) -> list[int]:
    """Fingerprints as SQL BIGINT (two's complement): PostgreSQL and SQLite have no unsigned 64-bit type."""
    return np.ascontiguousarray(values, dtype=np.uint64).view(np.int64).tolist()  # type: ignore[no-any-return]


def from_signed(values: list[int]) -> npt.NDArray[np.uint64]:
    return np.array(values, dtype=np.int64).view(np.uint64)
