"""A 1,000,000-token exchange: fingerprinted by the SDK, ingested and matched by the service.

    .venv/bin/python bench/long_context.py

1. SDK: ``fingerprint_exchange`` of a 1,000,000-token prompt on one core (this process, one
   thread), in CPU seconds, the median of three after a warm-up call (a gateway process builds
   the tokeniser once). Reference: ``casefold().split()`` of the same prompt, the least any
   tokeniser in Python does.
2. Service: ``bleedwatch serve`` (1 worker) on a redis-server of its own + PostgreSQL. Both orders of a leak:
   the long prompt first and then an answer carrying 120 of its words (from past the sampling
   offset), and a fresh pair the other way round. Prints the time to 202 of each post, whether
   the finding was made, and the worker's peak RSS growth across the long ingests (VmHWM, reset
   before through /proc/<pid>/clear_refs).
Reference in the same run: the same process's time to ``orjson.loads`` the request body, the
least any JSON service must spend on it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.load import KEY, _corpus, process_tree
from bench.service import running_service
from bleedwatch.exchange import fingerprint_exchange


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()

    words = _corpus()
    rng = np.random.default_rng(args.seed)
    prompts = [words.random(rng, args.tokens) for _ in range(2)]
    long_prompt, answer_text = " ".join(prompts[0]), " ".join(words.random(rng, 300))
    start = time.process_time()
    fingerprint_exchange(
        "warm-up: the tokeniser's pattern is built once per process, ü",
        "",
        key=KEY,
        tenant="v",
        request_id="w",
        model="m",
    )
    warm_up = time.process_time() - start
    sdk_runs, reference_runs = [], []
    for _ in range(3):
        start = time.process_time()
        first = fingerprint_exchange(
            long_prompt,
            answer_text,
            key=KEY,
            tenant="victim",
            request_id="long-1",
            model="m-1m",
            meta={"prompt_tokens": args.tokens},
        )
        sdk_runs.append(time.process_time() - start)
        start = time.process_time()
        long_prompt.casefold().split()
        reference_runs.append(time.process_time() - start)
    sdk_seconds, reference_seconds = sorted(sdk_runs)[1], sorted(reference_runs)[1]
    second = fingerprint_exchange(
        " ".join(prompts[1]), "ok", key=KEY, tenant="victim", request_id="long-2", model="m-1m"
    )
    fps = len(first["prompt"]["fingerprints"]) * 3 // 32
    print(
        f"SDK: {first['prompt']['token_count']:,}-token prompt fingerprinted in {sdk_seconds:.2f} s of CPU "
        f"(median of 3, one thread; {first['prompt']['token_count'] / sdk_seconds / 1e6:.1f}M tokens/s), "
        f"{fps:,} fingerprints; once per process before that, {warm_up:.2f} s to build the tokeniser"
    )
    print(
        f"  reference: casefold().split() of the same prompt, {reference_seconds:.2f} s "
        f"(the SDK takes {sdk_seconds / reference_seconds:.1f}x that)"
    )

    def answer(source: list[str], tenant: str, rid: str) -> dict[str, Any]:
        leak = source[700_000:700_120] if len(source) > 700_120 else source[-120:]
        text = " ".join(words.random(rng, 80) + leak + words.random(rng, 80))
        return fingerprint_exchange(
            " ".join(words.random(rng, 200)), text, key=KEY, tenant=tenant, request_id=rid, model="m-1m"
        )

    leak_after = answer(prompts[0], "other", "answer-1")  # source first, then the leak
    leak_before = answer(prompts[1], "third", "answer-2")  # the leak first, then its source

    with running_service(workers=1, own_redis=True) as service:
        token = service.key("ingest")
        reader = service.key("read")
        worker = process_tree(service.pid)[-1]
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        with httpx.Client(base_url=service.url, headers=headers, timeout=120) as client:
            rss_before = status_kb(worker, "VmRSS")
            peak_reset = reset_peak(worker)
            timings = []
            for name, exchange in (
                ("long prompt (source)", first),
                ("answer with 120 of its words", leak_after),
                ("answer with 120 words of a prompt not sent yet", leak_before),
                ("that long prompt (source)", second),
            ):
                body = orjson.dumps({"exchanges": [exchange]})
                t = time.perf_counter()
                resp = client.post("/v1/exchanges", content=body)
                elapsed = time.perf_counter() - t
                assert resp.status_code == 202, resp.text
                timings.append((name, elapsed, resp.json(), len(body)))
            peak = status_kb(worker, "VmHWM")
            rss_after = status_kb(worker, "VmRSS")
            t = time.perf_counter()
            orjson.loads(orjson.dumps({"exchanges": [first]}))
            parse_seconds = time.perf_counter() - t
        found = httpx.get(f"{service.url}/v1/findings", headers={"Authorization": f"Bearer {reader}"}).json()["items"]
    for name, elapsed, result, size in timings:
        print(f"  {name}: 202 in {elapsed:.2f} s ({size / 1e6:.1f} MB body), {result}")
    print(
        f"  findings: {sorted((f['source_request_ids'][0], f['recipient_request_id']) for f in found)} "
        "(expected long-1 -> answer-1 and long-2 -> answer-2)"
    )
    growth = peak - rss_before if peak_reset else float("nan")
    print(
        f"  worker RSS: {rss_before / 1024:.0f} MB before, peak growth {growth / 1024:.0f} MB, "
        f"{rss_after / 1024:.0f} MB after"
    )
    print(f"  reference: orjson.loads of the long prompt's body alone: {parse_seconds * 1000:.0f} ms")


if __name__ == "__main__":
    main()
