"""What ``bleedwatch tap`` adds to an answer's latency: the same streams, direct and through the tap.

    .venv/bin/python bench/tap.py                     # 200 concurrent streams, 3 rounds
    .venv/bin/python bench/tap.py --concurrency 50 --requests 1000

Three server processes, as deployed: the simulator's engine (service/tools/sim, its OpenAI front,
fixed mode), the tap in front of it (uvloop, httptools; one process), and a stub bleedwatch
that answers 202 at once (the tap fingerprints every answer and ships it, as in production;
what bleedwatch does with the batches is not the tap's latency). The load generator, in this
process, keeps ``--concurrency`` chat-completion streams open, each on its own keep-alive
connection (a raw HTTP/1.1 client: its own cost stays small), and records for each request
the time to the first byte of the answer's body
(TTFB) and to its last byte (total). Rounds alternate direct and tapped runs, so both see the
same machine; the first ``--concurrency`` requests of each run (connections opening) are not
counted. Every process shares the machine's cores, the tap's fingerprinting included: on a
small machine the difference is mostly the tap's CPU competing with the engine's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.load import percentile
from service.local_server import free_port
from service.tools.sim.corpus import prompt

TENANTS = ("acme", "globex", "initech", "umbrella")
KEY_HEX = "11" * 32


def engine_server(port: int, chunk_delay: float) -> None:
    import uvicorn

    from service.tools.sim.engine import Engine, EngineConfig, Mode
    from service.tools.sim.front import create_front, sim_keys

    # Pools large enough that 200 prompts in flight are never refused for room.
    config = EngineConfig(mode=Mode.FIXED, context_length=4_000, prefill_pool_tokens=4_000, decode_pool_tokens=4_000)
    app = create_front(Engine(config), sim_keys(TENANTS), chunk_delay_seconds=chunk_delay)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", loop="uvloop", http="httptools")


def stub_bleedwatch(port: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def ingest(request: Request) -> Response:
        body = orjson.loads(await request.body())
        count = len(body.get("exchanges", ()))
        return JSONResponse({"accepted": count, "duplicates": 0, "findings": 0}, status_code=202)

    app = Starlette(
        routes=[Route("/v1/exchanges", ingest, methods=["POST"]), Route("/v1/sdk/drops", ingest, methods=["POST"])]
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", loop="uvloop", http="httptools")


def tap_server(port: int, upstream: str, bleedwatch: str, fingerprint_workers: int) -> None:
    import uvicorn

    from service.tap import Tap, TapSettings

    settings = TapSettings(
        upstream_url=upstream,
        bleedwatch_url=bleedwatch,
        bleedwatch_api_key="bw_bench_key",  # a str, as from the environment
        fingerprint_key=KEY_HEX,
        flush_seconds=0.5,
        fingerprint_workers=fingerprint_workers,
        metrics_port=None,  # no metrics port: several run side by side
    )
    tap = Tap(settings)
    uvicorn.run(tap, host="127.0.0.1", port=port, log_level="warning", loop="uvloop", http="httptools")


@contextlib.contextmanager
def processes(*targets: tuple[object, tuple[object, ...]]) -> Iterator[None]:
    # Not daemons: the tap starts its own fingerprinting process, which a daemon may not.
    procs = [multiprocessing.Process(target=t, args=a) for t, a in targets]  # type: ignore[arg-type]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        for p in reversed(procs):  # the tap first: its last batches still reach the stub
            p.terminate()
            p.join(10)


def wait_up(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(f"{url}/v1/models", timeout=1)
            return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not start")


async def _stream(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, float, float]:
    """One request on a kept-alive connection: status, time to the first body byte, to the last."""
    started = time.perf_counter()
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    headers = head.lower()
    first = 0.0
    if b"transfer-encoding: chunked" in headers:
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
            first = first or time.perf_counter()
    else:
        length = int(headers.split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        first = time.perf_counter()
    return status, first - started, time.perf_counter() - started


async def run(url: str, concurrency: int, requests: int, words: int) -> tuple[list[float], list[float], int]:
    """``requests`` streamed chat completions, ``concurrency`` at a time; TTFB and total of each, errors.

    A raw HTTP/1.1 client on kept-alive connections (uvloop streams): a client library's own cost
    per request and per chunk would add the same to both sides but crowd the shared cores.
    """
    host, port = url.removeprefix("http://").split(":")
    requests_bytes = []
    for i, t in enumerate(TENANTS * 8):
        body = orjson.dumps(
            {
                "model": "sim-open-weights-1m",
                "messages": [{"role": "user", "content": prompt(t, words, 97 * i)}],
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer sk-sim-{t}\r\n"
            f"X-Tenant-Id: {t}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        requests_bytes.append(head.encode() + body)
    ttfb: list[float] = []
    total: list[float] = []
    errors = 0
    issued = 0

    async def worker() -> None:
        nonlocal issued, errors
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while issued < requests:
                i = issued
                issued += 1
                status, first, end = await _stream(reader, writer, requests_bytes[i % len(requests_bytes)])
                if status != 200:
                    errors += 1
                elif i >= concurrency:  # the first round opens the connections
                    ttfb.append(first)
                    total.append(end)
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ttfb, total, errors


def summary(values: list[float]) -> tuple[float, float]:
    s = sorted(values)
    return percentile(s, 0.5) * 1000, percentile(s, 0.99) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--requests", type=int, default=2_000, help="per run (one direct, one tapped, per round)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--words", type=int, default=200, help="prompt length; the engine answers with about 170 words")
    ap.add_argument(
        "--chunk-ms",
        type=float,
        default=20.0,
        help="the engine's pace: ms between two events of a stream (8 words each; 0 = all at once)",
    )
    ap.add_argument("--fingerprint-workers", type=int, default=1, help="the tap's (0: a thread of its own process)")
    args = ap.parse_args()

    engine_port, bw_port, tap_port = free_port(), free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    tap_url = f"http://127.0.0.1:{tap_port}"
    with processes(
        (engine_server, (engine_port, args.chunk_ms / 1000)),
        (stub_bleedwatch, (bw_port,)),
        (tap_server, (tap_port, engine_url, f"http://127.0.0.1:{bw_port}", args.fingerprint_workers)),
    ):
        wait_up(engine_url)
        wait_up(tap_url)
        load_before = os.getloadavg()[0]
        results: dict[str, tuple[list[float], list[float]]] = {"direct": ([], []), "tap": ([], [])}
        errors = 0
        started = time.perf_counter()
        for r in range(args.rounds):
            for mode, url in (("direct", engine_url), ("tap", tap_url)):
                ttfb, total, failed = uvloop.run(run(url, args.concurrency, args.requests, args.words))
                results[mode][0].extend(ttfb)
                results[mode][1].extend(total)
                errors += failed
                print(f"round {r + 1} {mode:<6}: {len(ttfb)} streams", file=sys.stderr)
        seconds = time.perf_counter() - started
        load_after = os.getloadavg()[0]
    print(
        f"bleedwatch tap: {args.concurrency} concurrent chat-completion streams, {args.rounds} rounds of "
        f"{args.requests} per side, {args.words}-word prompts, an event every {args.chunk_ms:g} ms; "
        f"{os.cpu_count()} CPUs, load average {load_before:.1f} before, {load_after:.1f} after; {errors} errors; "
        f"{seconds:.0f} s"
    )
    print(f"{'':<8} {'TTFB p50':>9} {'TTFB p99':>9} {'total p50':>10} {'total p99':>10}   (ms)")
    rows = {mode: (*summary(t), *summary(tot)) for mode, (t, tot) in results.items()}
    for mode, row in rows.items():
        print(f"{mode:<8} {row[0]:>9.2f} {row[1]:>9.2f} {row[2]:>10.2f} {row[3]:>10.2f}")
    diff = [b - a for a, b in zip(rows["direct"], rows["tap"], strict=True)]
    print(f"{'added':<8} {diff[0]:>9.2f} {diff[1]:>9.2f} {diff[2]:>10.2f} {diff[3]:>10.2f}")


if __name__ == "__main__":
    main()
