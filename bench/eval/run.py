"""Detection quality on held-out text, on the full service path (Redis + PostgreSQL), with numbers.

    .venv/bin/python -m bench.eval.run --split a --side held_out    # a full run (docs/detection.md)
    .venv/bin/python -m bench.eval.run --split a --side tune        # the families tuned on
    .venv/bin/python -m bench.eval.run --clean 2000 --leaks-per-cell 4 --offline   # a quick one, in process

Generates multi-tenant traffic from the text of one side of a split of corpus families
(bench/eval/families.py), with shared system prompts, public quotes, stock answers, self-echo,
long-context prompts, arrival-order races and injected leaks of 8 to 512 words of another
tenant's prompt or answer, some perturbed; imports the shipped public-text bundle as an
operator would (`bleedwatch allowlist import-public`), and nothing else; replays everything
through ``bleedwatch serve`` with the SDK; then scores the findings against the ground truth:
recall by span, perturbation and source, precision, false positives per 10,000 clean exchanges
and their severity, and how often the right source tenant was named.

Rules are tuned on one side and reported on the other; a change that helps the tuned side and
hurts the held-out one is reverted (bench/eval/RESULTS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.eval import offline
from bench.eval.families import SPLITS, held_out_public_texts, private_passages, public_texts, templates
from bench.eval.offline import SECONDS_PER_EXCHANGE
from bench.eval.traffic import PERTURBATIONS, SOURCES, SPANS, Traffic, generate, wire
from bench.service import Running, running_service
from bleedwatch.client import BleedwatchClient
from bleedwatch.exchange import fingerprint_exchange
from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS, Params
from bleedwatch.fingerprint.tokens import tokenize
from service.allowlist.public import bundle
from service.tools.probe import allowlist_add, import_public


async def replay(service: Running, traffic: Traffic, key: bytes, batch: int, params: Params) -> float:
    token = service.key("ingest")
    start = time.perf_counter()
    clock = time.time() - SECONDS_PER_EXCHANGE * (len(traffic.order) + 100)
    async with BleedwatchClient(
        service.url, token, batch_size=batch, flush_seconds=3600, wait_for_processing=True
    ) as client:
        for i, ex in enumerate(traffic.order):
            w = wire(ex)
            await client.submit(
                fingerprint_exchange(
                    w["prompt"],
                    w["response"],
                    key=key,
                    tenant=w["tenant"],
                    request_id=w["request_id"],
                    model="eval-model",
                    ts=clock + ex.ts * SECONDS_PER_EXCHANGE,
                    params=params,
                )
            )
            if i % 1000 == 0:
                print(f"  sent {i}/{len(traffic.order)}", file=sys.stderr)
    return time.perf_counter() - start


def all_findings(service: Running) -> list[dict[str, Any]]:
    token = service.key("read")
    out: list[dict[str, Any]] = []
    cursor = None
    with httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        while True:
            params: dict[str, Any] = {"limit": 500} | ({"cursor": cursor} if cursor else {})
            page = client.get("/v1/findings", params=params).json()
            out += page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                return out


def quoted(traffic: Traffic, finding: dict[str, Any], public: str) -> bool:
    """Is every stretch the finding matched a quote of the public text (``public``: its tokens, space-joined)?"""
    by_request = {ex.request_id: ex for ex in traffic.order}
    tokens = tokenize(" ".join(by_request[finding["recipient_request_id"]].response))
    ranges = [r for src in finding["evidence"]["sources"] for r in src["ranges"]]
    return all(f" {' '.join(tokens[r['response'][0] : r['response'][1]])} " in public for r in ranges)


def score(traffic: Traffic, findings: list[dict[str, Any]], public: list[list[str]]) -> dict[str, Any]:
    truth = {leak.recipient_request: leak for leak in traffic.leaks}
    by_recipient = {f["recipient_request_id"]: f for f in findings}
    cells: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    kinds: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    right_source = exact_request = detected = 0
    for leak in traffic.leaks:
        f = by_recipient.get(leak.recipient_request)
        cell = cells[(leak.span, leak.perturbation)]
        cell[1] += 1
        kind = kinds[leak.source_kind]
        kind[1] += 1
        if f is not None:
            detected += 1
            if f["source_tenant"] == leak.source_tenant:
                right_source += 1
                cell[0] += 1
                kind[0] += 1
                # The index names the first request of the source tenant that held the text;
                # tenants here re-send their documents, so an earlier request is often named.
                exact_request += leak.source_request in f["source_request_ids"]
    true_positive = sum(
        1
        for f in findings
        if (true_leak := truth.get(f["recipient_request_id"])) is not None
        and f["source_tenant"] == true_leak.source_tenant
    )
    false = [
        f
        for f in findings
        if (true_leak := truth.get(f["recipient_request_id"])) is None or f["source_tenant"] != true_leak.source_tenant
    ]
    clean_fp = sum(1 for f in findings if f["recipient_request_id"] not in truth)
    text = " " + " ".join(" ".join(tokenize(" ".join(t))) for t in public) + " "
    of_public = sum(quoted(traffic, f, text) for f in false)

    def recall(spans: tuple[int, ...]) -> float:
        hit = sum(cells[(s, k)][0] for s in spans for k in PERTURBATIONS)
        return hit / max(1, sum(cells[(s, k)][1] for s in spans for k in PERTURBATIONS))

    return {
        "cells": {f"{span}/{kind}": cells[(span, kind)] for span in SPANS for kind in PERTURBATIONS},
        "by_source": {k: kinds[k] for k in SOURCES},
        "recall_16": recall((16,)),
        "recall_24_up": recall(tuple(s for s in SPANS if s >= 24)),
        "findings": len(findings),
        "precision": true_positive / len(findings) if findings else 1.0,
        "false_positives": len(false),
        "clean": traffic.clean,
        "false_positives_per_10k_clean": 10_000 * clean_fp / traffic.clean,
        "false_of_public_text": of_public,  # quotes of the public text the traffic quotes, which the bundle lacks
        "false_by_severity": dict(Counter(str(f["severity"]) for f in false)),
        "right_source": right_source / detected if detected else 1.0,
        "exact_source_request": exact_request / right_source if right_source else 1.0,
        "false_findings": [
            {
                k: f[k]
                for k in (
                    "recipient_tenant",
                    "recipient_request_id",
                    "source_tenant",
                    "source_request_ids",
                    "matched_fingerprints",
                    "longest_run_tokens",
                    "severity",
                )
            }
            | {"ranges": [r for src in f["evidence"]["sources"] for r in src["ranges"]]}
            for f in false
        ],
        "detected": detected,
        "leaks": len(traffic.leaks),
        "missed": [
            f"{leak.span}/{leak.perturbation}/{leak.source_kind} {leak.source_request} -> {leak.recipient_request}"
            for leak in traffic.leaks
            if (f := by_recipient.get(leak.recipient_request)) is None or f["source_tenant"] != leak.source_tenant
        ],
    }


def report(result: dict[str, Any], args: argparse.Namespace, elapsed: float, exchanges: int) -> str:
    lines = [
        f"split {args.split} {args.side}: exchanges {exchanges} "
        f"({result['clean']} clean, {result['leaks']} with a leak) "
        f"from {args.tenants} tenants, "
        f"replayed in {elapsed:.0f} s; n={args.n} w={args.w} response_w={args.response_w}, "
        f"sampling 1/{DEFAULT_PARAMS.sample_mod} after {DEFAULT_PARAMS.sample_after} tokens",
        "",
        "recall by leaked span (words) and perturbation:",
        "| span | " + " | ".join(PERTURBATIONS) + " | all |",
        "|---:|" + "---:|" * (len(PERTURBATIONS) + 1),
    ]
    for span in SPANS:
        row = [result["cells"][f"{span}/{k}"] for k in PERTURBATIONS]
        hit, total = sum(c[0] for c in row), sum(c[1] for c in row)
        lines.append(f"| {span} | " + " | ".join(f"{c[0] / c[1]:.2f}" for c in row) + f" | {hit / total:.3f} |")
    by_source = result["by_source"]
    lines += [
        "",
        f"recall: 24 words and up {result['recall_24_up']:.3f}, 16 words {result['recall_16']:.3f}; "
        + ", ".join(f"{k}-sourced {hit}/{total}" for k, (hit, total) in by_source.items()),
        f"precision {result['precision']:.4f} ({result['findings']} findings, {result['false_positives']} false: "
        f"{result['false_by_severity']})",
        f"false positives per 10,000 clean exchanges: {result['false_positives_per_10k_clean']:.2f} "
        f"({result['false_of_public_text']} of the false findings quote public text the bundle lacks)",
        f"right source tenant on {result['right_source']:.4f} of {result['detected']} detected leaks "
        f"(and the very request that leaked among source_request_ids on {result['exact_source_request']:.2f})",
    ]
    return "\n".join(lines)


def explain(traffic: Traffic, false: list[dict[str, Any]], findings: list[dict[str, Any]], limit: int) -> None:
    """Print the matched text of false findings: the harness has the text, the service never does."""
    by_request = {ex.request_id: ex for ex in traffic.order}
    wanted = {f["recipient_request_id"] for f in false[:limit]}
    for f in findings:
        if f["recipient_request_id"] not in wanted:
            continue
        response = tokenize(" ".join(by_request[f["recipient_request_id"]].response))
        for src in f["evidence"]["sources"]:
            for r in src["ranges"]:
                source = by_request[r["source_request_id"]]
                text = source.prompt if r["source_kind"] == "prompt" else source.response
                a, b = r["response"]
                print(
                    f"- {f['recipient_tenant']} <- {src['tenant']} ({r['fingerprints']} fingerprints): "
                    f"{' '.join(response[a:b])!r}  ~  {' '.join(tokenize(' '.join(text))[slice(*r['source'])])!r}"
                )


def judge_again(
    traffic: Traffic,
    findings: list[dict[str, Any]],
    public: list[list[str]],
    replayed: offline.Replayed,
    result: dict[str, Any],
) -> None:
    """Which findings are no finding against the window at the end of the traffic, and the scores
    without them: what withdrawing findings that later text explains would do (bench/eval/RESULTS.md)."""
    false = {f["recipient_request_id"] for f in result["false_findings"]}
    kept = [f for f in findings if asyncio.run(replayed.judge_again(f["recipient_request_id"])) is not None]
    gone = {f["recipient_request_id"] for f in findings} - {f["recipient_request_id"] for f in kept}
    again = score(traffic, kept, public)
    print(
        f"\njudged again at the end: {len(gone & false)} of {len(false)} false findings and "
        f"{len(gone - false)} of {len(findings) - len(false)} true ones are no finding; without them "
        f"precision {again['precision']:.4f}, 16 words {again['recall_16']:.3f}, "
        f"24 words and up {again['recall_24_up']:.3f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tenants", type=int, default=50)
    p.add_argument("--clean", type=int, default=10_000)
    p.add_argument("--leaks-per-cell", type=int, default=20)
    p.add_argument("--long-share", type=float, default=0.01)
    p.add_argument("--response-share", type=float, default=0.15, help="share of leaks of a source's answer")
    p.add_argument(
        "--chat-share", type=float, default=0.3, help="share of exchanges a chat goes on from, sending them back"
    )
    p.add_argument("--split", choices=sorted(SPLITS), default="a", help="families split (bench/eval/families.py)")
    p.add_argument("--side", choices=("tune", "held_out"), default="held_out", help="which side of the split")
    p.add_argument("--allowlist-quoted", action="store_true", help="also allowlist the public texts the traffic quotes")
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", type=Path, help="also write the result here")
    p.add_argument("--explain", type=int, default=0, help="print the text behind this many false findings")
    p.add_argument(
        "--offline", action="store_true", help="in process on the embedded index (for tuning; report full runs)"
    )
    p.add_argument(
        "--copy-tokens",
        type=int,
        default=8,
        help="passages sharing this many tokens in a row are copies, and one of them is dropped: what is shorter "
        "(natural overlap of documents of one genre, stitched phrases) stays in the clean traffic (at most 16)",
    )
    p.add_argument(
        "--why-missed", type=int, default=0, metavar="WORDS", help="explain each missed leak this long or longer"
    )
    p.add_argument(
        "--judge-again",
        action="store_true",
        help="judge every finding again against the index at the end: how many the rest of the window explains",
    )
    p.add_argument(
        "--judge-after",
        type=float,
        metavar="SECONDS",
        help="report a finding only if judging it again this long (of traffic) after it was first made still finds "
        "it: what BLEEDWATCH_FINDINGS_HOLD_SECONDS does (Matcher.confirm)",
    )
    p.add_argument("--n", type=int, default=DEFAULT_PARAMS.n, help="shingle length (SDK parameter)")
    p.add_argument("--w", type=int, default=DEFAULT_PARAMS.w, help="prompts' winnowing window (SDK parameter)")
    p.add_argument(
        "--response-w", type=int, default=DEFAULT_PARAMS.response_w, help="responses' window (SDK parameter)"
    )
    args = p.parse_args()

    names = SPLITS[args.split][args.side]
    print(f"building corpus: split {args.split}, {args.side} families {', '.join(names)} ...", file=sys.stderr)
    passages = [p.words for p in private_passages(args.seed, names, near_copies=True, copy_tokens=args.copy_tokens)]
    public = public_texts() if args.side == "tune" else held_out_public_texts()
    traffic = generate(
        passages,
        public,
        templates(5, args.seed, names),
        tenants=args.tenants,
        clean=args.clean,
        leaks_per_cell=args.leaks_per_cell,
        long_share=args.long_share,
        seed=args.seed,
        response_share=args.response_share,
        chat_share=args.chat_share,
    )
    digest = hashlib.sha256(orjson.dumps([[ex.request_id, ex.prompt, ex.response] for ex in traffic.order])).hexdigest()
    print(f"traffic {digest[:12]} from {len(passages)} passages", file=sys.stderr)
    key = random.Random(args.seed).randbytes(32)  # same traffic, same key: runs compare
    params = replace(DEFAULT_PARAMS, n=args.n, w=args.w, response_w=args.response_w)
    # The shipped public-text bundle, as `bleedwatch allowlist import-public` imports it; with
    # --allowlist-quoted also the very texts the traffic quotes, as an operator who knew them would.
    quoted = [" ".join(t) for t in public] if args.allowlist_quoted else []
    if args.judge_after is not None and not args.offline:
        sys.exit("--judge-after needs --offline: it asks the in-process index")
    if args.offline:
        texts = [t.text for t in bundle().texts()] + quoted
        allowed = offline.allowlist(texts, key, params)
        replayed = asyncio.run(offline.replay(traffic, key, params, allowed, judge_after=args.judge_after))
        findings, elapsed = replayed.findings, replayed.seconds
    else:
        with tempfile.TemporaryDirectory() as tmp, running_service() as service:
            admin = service.key("admin")
            import_public(url=service.url, api_key=admin, key=key, n=args.n, w=args.w)
            if quoted:
                files = []
                for i, text in enumerate(quoted):
                    files.append(Path(tmp) / f"public-{i}.txt")
                    files[-1].write_text(text)
                allowlist_add(files, url=service.url, api_key=admin, key=key, label=None, n=args.n, w=args.w)
            elapsed = asyncio.run(replay(service, traffic, key, args.batch, params))
            findings = all_findings(service)
    result = score(traffic, findings, public)
    print(report(result, args, elapsed, len(traffic.order)))
    if args.judge_after is not None:
        # The same traffic without the hold: both sides of the comparison from one replay.
        result["without_hold"] = score(traffic, replayed.drafted, public)
        print("\nwithout the hold (every first draft kept):")
        print(report(result["without_hold"], args, elapsed, len(traffic.order)))
    if args.why_missed:
        if not args.offline:
            sys.exit("--why-missed needs --offline: it asks the in-process index")
        print("\nwhy missed (the matcher's steps on the recipient's answer, against the index at the end):")
        named = {f["recipient_request_id"]: f["source_tenant"] for f in findings}
        for leak in traffic.leaks:
            if named.get(leak.recipient_request) != leak.source_tenant and leak.span >= args.why_missed:
                got = asyncio.run(replayed.why(leak.recipient_request))
                print(
                    f"- {leak.span}/{leak.perturbation}/{leak.source_kind} {leak.source_tenant} -> "
                    f"{leak.recipient_request}: {got.get(leak.source_tenant, 'nothing of the source')}"
                )
    if args.judge_again:
        if not args.offline:
            sys.exit("--judge-again needs --offline: it asks the in-process index")
        judge_again(traffic, findings, public, replayed, result)
    if args.explain:
        explain(traffic, result["false_findings"], findings, args.explain)
    if args.json:
        args.json.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
