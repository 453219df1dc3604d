"""Properties of the ingest decoder (service/ingest/decode.py), checked with hypothesis.

Whatever a gateway sends for one text, it either decodes to arrays that satisfy every invariant
the matcher relies on (as many offsets as fingerprints, offsets strictly increasing and below
token_count), or is refused with Invalid/PayloadTooLarge naming the field, never echoing input.
"""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bleedwatch.fingerprint.encoding import U32_LE, U64_LE, encode
from service.errors import Invalid, PayloadTooLarge
from service.ingest.decode import Limits, check_batch
from service.ingest.schemas import Batch
from service.wire import Text, decode_array, decode_text
from tests.traffic import exchange

LIMITS = Limits(max_exchanges=10, max_fingerprints=64, max_future_seconds=300, max_age_seconds=3600)
WHERE = "exchanges[7].prompt"

U64 = st.integers(0, 2**64 - 1)
U32 = st.integers(0, 2**32 - 1)
B64 = st.one_of(
    st.binary(max_size=80).map(lambda raw: base64.b64encode(raw).decode()),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=", max_size=40),
    st.text(max_size=20),
)
FINGERPRINTS = st.one_of(B64, st.lists(U64, max_size=80))
OFFSETS = st.one_of(B64, st.lists(U32, max_size=80), st.lists(st.integers(0, 200), max_size=80).map(sorted))


def _echoes(message: str, value: str | list[int]) -> bool:
    if isinstance(value, str):
        return len(value) >= 12 and value in message
    return any(len(str(v)) >= 12 and str(v) in message for v in value)


@settings(max_examples=300, deadline=None)
@given(fingerprints=FINGERPRINTS, offsets=OFFSETS, token_count=st.integers(0, 300))
def test_any_text_decodes_to_valid_arrays_or_is_refused_naming_the_field(
    fingerprints: str | list[int], offsets: str | list[int], token_count: int
) -> None:
    text = Text(fingerprints=fingerprints, offsets=offsets, token_count=token_count)
    detail = None
    try:
        decoded = decode_text(text, WHERE, LIMITS.max_fingerprints)
    except (Invalid, PayloadTooLarge) as exc:  # the only exceptions allowed
        detail = exc.detail
    if detail is not None:
        assert detail.startswith(WHERE), detail
        assert not _echoes(detail, fingerprints)
        assert not _echoes(detail, offsets)
        return
    assert decoded.values.dtype == np.uint64
    assert decoded.offsets.dtype == np.uint32
    assert len(decoded.values) == len(decoded.offsets) <= LIMITS.max_fingerprints
    assert decoded.token_count == token_count
    offs = decoded.offsets.astype(np.int64)
    assert bool(np.all(offs[1:] > offs[:-1]))
    if len(offs):
        assert int(offs[-1]) < max(token_count, 1)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(U64, max_size=64),
    data=st.data(),
    as_base64=st.booleans(),
)
def test_well_formed_texts_round_trip_in_both_encodings(
    values: list[int], data: st.DataObject, as_base64: bool
) -> None:
    offsets = sorted(data.draw(st.sets(st.integers(0, 10_000), min_size=len(values), max_size=len(values))))
    token_count = (offsets[-1] + 1 if offsets else 0) + data.draw(st.integers(0, 5))
    if as_base64:
        text = Text(
            fingerprints=encode(np.array(values, dtype=np.uint64), U64_LE),
            offsets=encode(np.array(offsets, dtype=np.uint32), U32_LE),
            token_count=token_count,
        )
    else:
        text = Text(fingerprints=values, offsets=offsets, token_count=token_count)
    decoded = decode_text(text, WHERE, LIMITS.max_fingerprints)
    assert decoded.values.tolist() == values
    assert decoded.offsets.tolist() == offsets


@settings(max_examples=100, deadline=None)
@given(values=st.lists(U64, min_size=65, max_size=100))
def test_more_fingerprints_than_the_limit_is_413(values: list[int]) -> None:
    text = Text(fingerprints=values, offsets=list(range(len(values))), token_count=len(values))
    with pytest.raises(PayloadTooLarge, match=r"BLEEDWATCH_MAX_FINGERPRINTS_PER_TEXT"):
        decode_text(text, WHERE, LIMITS.max_fingerprints)


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(B64, st.lists(U64, max_size=20)), wide=st.booleans())
def test_decode_array_returns_native_unsigned_or_refuses(value: str | list[int], wide: bool) -> None:
    dtype = U64_LE if wide else U32_LE
    if isinstance(value, list) and not wide:
        value = [v % 2**32 for v in value]
    detail = None
    try:
        out = decode_array(value, dtype, "text.fingerprints")
    except Invalid as exc:
        detail = exc.detail
    if detail is not None:
        assert detail.startswith("text.fingerprints ")
        assert not _echoes(detail, value)
        return
    assert out.dtype == dtype.newbyteorder("=")


@settings(max_examples=200, deadline=None)
@given(age=st.floats(-4000, 8000, allow_nan=False))
def test_timestamps_are_accepted_exactly_within_the_window(age: float) -> None:
    assume(abs(age - 3600) > 0.01 and abs(age + 300) > 0.01)  # microsecond rounding at the edges
    now = time.time()
    ex = exchange("acme", "r-1", "a b c d", "e f g h", now)
    ex["ts"] = datetime.fromtimestamp(now - age, UTC).isoformat()
    batch = Batch.model_validate({"exchanges": [ex]})
    accepted = -LIMITS.max_future_seconds <= age <= (LIMITS.max_age_seconds or 0)
    detail = None
    try:
        check_batch(batch, LIMITS, now)
    except Invalid as exc:
        detail = exc.detail
    assert (detail is None) == accepted, (age, detail)
    assert detail is None or detail.startswith("exchanges[0].ts: more than")
