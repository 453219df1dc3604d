"""What the SDK costs a gateway's event loop, per exchange, with the sidecar up and with it away.

    .venv/bin/python bench/sdk_overhead.py

A gateway-like event loop (uvloop) serves a stream of chat exchanges at ``--rate`` exchanges/s;
for each one it calls ``await client.submit_text(...)`` after the answer, as the README shows.
Measured on that loop:

- the time each ``submit_text`` call takes before it returns (what the gateway's request pays);
- the loop's lag: a ticker asks to wake every millisecond and records how late it wakes (what
  every other request on the loop pays while the SDK fingerprints, batches, posts and spools).

Three runs: no SDK at all (the reference, same loop, same ticker), the SDK posting to a stub
sidecar in another process (answers 202 at once), and the SDK with the sidecar unreachable
and a spool (fsync on every append). Chat exchanges are 300-1,200 words; ``--long-every``
exchanges is one with a 200,000-word prompt, which the SDK fingerprints in a worker process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.load import KEY, _corpus, percentile
from bleedwatch.client import BleedwatchClient
from service.local_server import free_port


def stub_sidecar(port: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def ingest(request: Request) -> Response:
        await request.body()
        return JSONResponse({"accepted": 0, "duplicates": 0, "findings": 0}, status_code=202)

    app = Starlette(
        routes=[Route("/v1/exchanges", ingest, methods=["POST"]), Route("/v1/sdk/drops", ingest, methods=["POST"])]
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", loop="uvloop", http="httptools")


async def run(mode: str, url: str, texts: list[tuple[str, str]], rate: float, spool_dir: str) -> dict[str, float]:
    lags: list[float] = []
    calls: list[float] = []
    stop = False

    async def ticker() -> None:
        while not stop:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t - 0.001)

    tick = asyncio.create_task(ticker())
    client = None
    if mode != "none":
        spool = str(Path(spool_dir) / f"{mode}.spool") if mode == "away" else None
        client = BleedwatchClient(url, "bw_bench_key", batch_size=100, flush_seconds=0.5, spool=spool, max_attempts=2)
        await client.__aenter__()
    start = time.perf_counter()
    for i, (prompt, response) in enumerate(texts):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if client is not None:
            t = time.perf_counter()
            await client.submit_text(
                prompt, response, key=KEY, tenant=f"t-{i % 20}", request_id=f"{mode}-{i}", model="m"
            )
            calls.append(time.perf_counter() - t)
    if client is not None:
        await client.flush_hashing()
    elapsed = time.perf_counter() - start
    stop = True
    await tick
    out = {"elapsed": elapsed, "lag_p50": percentile(sorted(lags), 0.5), "lag_p99": percentile(sorted(lags), 0.99)}
    out["lag_max"] = max(lags)
    if client is not None:
        calls.sort()
        out |= {"call_p50": percentile(calls, 0.5), "call_p99": percentile(calls, 0.99), "call_max": calls[-1]}
        out |= {"dropped": client.dropped, "spooled": client.spooled, "accepted_or_sent": len(texts) - client.dropped}
        if client.spool is not None:
            out["spool_mb"] = client.spool.size / 1e6
        with contextlib.suppress(Exception):  # the unreachable sidecar's last flush fails by design
            await client.aclose()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exchanges", type=int, default=2000)
    p.add_argument("--rate", type=float, default=200.0, help="exchanges/s the gateway serves")
    p.add_argument("--long-every", type=int, default=500)
    p.add_argument("--seed", type=int, default=3)
    args = p.parse_args()
    logging.getLogger("bleedwatch.sdk").setLevel(logging.CRITICAL)  # the "away" run retries by design
    words = _corpus()
    rng = np.random.default_rng(args.seed)
    texts = []
    for i in range(args.exchanges):
        n = 200_000 if args.long_every and i % args.long_every == args.long_every - 1 else int(rng.integers(300, 1200))
        texts.append((" ".join(words.random(rng, n)), " ".join(words.random(rng, int(rng.integers(60, 400))))))
    port = free_port()
    sidecar = multiprocessing.get_context("spawn").Process(target=stub_sidecar, args=(port,), daemon=True)
    sidecar.start()
    time.sleep(1.5)
    up = f"http://127.0.0.1:{port}"
    away = f"http://127.0.0.1:{free_port()}"
    results = {}
    with tempfile.TemporaryDirectory() as spool_dir:
        for mode, url in (("none", up), ("sidecar up", up), ("away", away)):
            results[mode] = uvloop.run(run(mode, url, texts, args.rate, spool_dir))
    sidecar.terminate()
    long_count = args.exchanges // args.long_every if args.long_every else 0
    print(
        f"{args.exchanges} exchanges at {args.rate:.0f}/s ({long_count} with a 200,000-word prompt), "
        "gateway loop on uvloop, ticker every 1 ms"
    )
    for mode, r in results.items():
        line = (
            f"  {mode}: loop lag p50 {r['lag_p50'] * 1e3:.2f} ms, p99 {r['lag_p99'] * 1e3:.2f} ms, "
            f"max {r['lag_max'] * 1e3:.1f} ms"
        )
        if "call_p50" in r:
            line += (
                f"; submit_text returns in p50 {r['call_p50'] * 1e6:.0f} us, p99 {r['call_p99'] * 1e6:.0f} us, "
                f"max {r['call_max'] * 1e3:.1f} ms; dropped {r['dropped']:.0f}"
            )
            if "spool_mb" in r:
                line += f", spooled {r['spooled']:.0f} ({r['spool_mb']:.1f} MB)"
        print(line)
    base = results["none"]["lag_p99"]
    print(
        f"  reference: the same loop without the SDK, lag p99 {base * 1e3:.2f} ms; added by the SDK at p99: "
        f"{(results['sidecar up']['lag_p99'] - base) * 1e3:.2f} ms (sidecar up), "
        f"{(results['away']['lag_p99'] - base) * 1e3:.2f} ms (sidecar away)"
    )


if __name__ == "__main__":
    main()
