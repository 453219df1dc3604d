"""What hostile response shapes cost to process, against an honest copy of the same size.

    .venv/bin/python bench/hostile.py                                    # the embedded index
    .venv/bin/python bench/hostile.py --redis redis://127.0.0.1:6379/0   # Redis (keys under a prefix of its own)

Any holder of an ingest key chooses the values it sends. Each case is one exchange of another
tenant, then a response of ``--fingerprints`` values (offsets 0, 1, 2, ...), processed by the
service's ``Ingestor`` in process (as ``bench/eval/offline.py`` does: findings kept in memory,
no database), timed from the queued item to its result, the median of ``--rounds``:

a. one value over and over, which the other tenant's prompt holds (a model stuck repeating a word,
   or a gateway choosing its values): every match is a piece of one shingle; no finding;
b. the ten values of the other tenant's prompt, again and again: its 13 tokens copied each time, a finding;
c. the reference: an honest full copy of the other tenant's prompt of as many distinct values.

``--profile`` prints where the time goes (classifying and judging run inline, not in a thread, so
the profile sees them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import pstats
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, cast
from unittest import mock

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.eval.offline import _Allowlist, _Collect
from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS, key_id
from service.config import Settings
from service.index.factory import make_index
from service.ingest.decode import Limits
from service.ingest.service import Ingestor
from service.matching.matcher import Matcher
from service.matching.thresholds import thresholds

KEY_ID = key_id(bytes(32), DEFAULT_PARAMS)
VALUE = 123_456_789


def text(values: list[int]) -> dict[str, Any]:
    return {"fingerprints": values, "offsets": list(range(len(values))), "token_count": len(values) + 8}


def exchange(tenant: str, request_id: str, ts: float, prompt: list[int], response: list[int]) -> dict[str, Any]:
    p = DEFAULT_PARAMS
    return {
        "tenant": tenant,
        "request_id": request_id,
        "model": "m",
        "ts": ts,
        "key_id": KEY_ID,
        "scheme": {
            "version": 1,
            "n": p.n,
            "w": p.w,
            "sample_after": p.sample_after,
            "sample_mod": p.sample_mod,
            "response_w": p.response_w,
        },
        "prompt": text(prompt),
        "response": text(response),
        "meta": {},
    }


def shapes(count: int) -> dict[str, tuple[list[int], list[int]]]:
    """Per case, the other tenant's prompt and the response."""
    ten = [VALUE + 1000 * k for k in range(10)]
    honest = list(range(10**9, 10**9 + count))
    return {
        "a": ([VALUE], [VALUE] * count),
        "b": (ten, [ten[i % 10] for i in range(count)]),
        "c": (honest, honest),
    }


async def one(case: str, count: int, redis: str | None, profile: bool) -> tuple[float, int]:
    settings = Settings(redis_url=redis, database_url=None, key_prefix=f"bwhostile{uuid.uuid4().hex[:8]}")
    index = make_index(settings)
    writer = _Collect()
    matcher = Matcher(index, _Allowlist(np.empty(0, np.uint64)), thresholds(settings), settings.max_request_seconds)
    limits = Limits(settings.max_batch_exchanges, settings.max_fingerprints_per_text, 10**9)
    ingestor = Ingestor(index, matcher, cast(Any, None), limits, writer)
    sent, response = shapes(count)[case]
    now = time.time()
    try:
        first = exchange("other", "other-1", now - 10, sent, [1, 2])
        await ingestor.process(b"\n" + orjson.dumps({"exchanges": [first]}))
        item = b"\n" + orjson.dumps({"exchanges": [exchange("recipient", "r-1", now - 5, [3, 4], response)]})
        profiler = cProfile.Profile() if profile else None
        started = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        result = await ingestor.process(item)
        seconds = time.perf_counter() - started
        if profiler is not None:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
        return seconds, result.findings or 0
    finally:
        if redis is not None:
            client = cast(Any, index).client
            async for key in client.scan_iter(match=f"{settings.key_prefix}:*", count=1000):
                await client.unlink(key)
        await index.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="*", default=["a", "b", "c"], help="a, b and/or c")
    p.add_argument("--redis", help="a Redis URL; the embedded index without")
    p.add_argument("--fingerprints", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    if set(args.cases) - {"a", "b", "c"}:
        p.error("cases are a, b and c")

    async def inline(f: Any, *a: Any) -> Any:
        return f(*a)

    backend = "Redis" if args.redis else "embedded"
    with mock.patch("asyncio.to_thread", new=inline) if args.profile else contextlib.nullcontext():
        for case in args.cases:
            runs = [asyncio.run(one(case, args.fingerprints, args.redis, args.profile)) for _ in range(args.rounds)]
            seconds = statistics.median(s for s, _ in runs)
            print(f"{backend} {case}: {seconds:.2f} s (median of {len(runs)}), findings {runs[0][1]}", flush=True)


if __name__ == "__main__":
    main()
