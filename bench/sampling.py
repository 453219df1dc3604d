"""What sampling costs in detection, computed: request-level against content-defined.

    .venv/bin/python -m bench.sampling

Request-level sampling keeps whole exchanges with probability r; a leak is seen only if both
its source and its recipient were kept, so with probability r². Content-defined sampling keeps,
past ``sample_after`` tokens, the fingerprints whose value is 0 mod ``sample_mod`` on *both*
sides alike, so a leaked span loses fingerprints but not its chance to be seen. The second
table is measured: real stdlib text spans placed past the sampling offset of a long prompt,
scored with the service's own run and finding rules.
"""

from __future__ import annotations

import random

import numpy as np

from bench.corpus import docstrings
from bleedwatch.fingerprint.scheme import Params, fingerprint_text
from service.config import Settings
from service.matching.evidence import Budget, Match, Response, Thresholds, evaluate, is_finding
from service.matching.thresholds import thresholds as app_thresholds

SPANS = (16, 24, 32, 64, 128, 512)
MODS = (1, 2, 4, 8, 16, 32)
TRIALS = 200
INCIDENT_LEAKS = 155


def thresholds() -> Thresholds:
    return app_thresholds(Settings())


def detected(span: list[str], where: dict[int, int], params: Params, key: bytes, t: Thresholds) -> bool:
    """Is ``span``, quoted in an answer, a finding against a source whose fingerprints are ``where``?"""
    answer = params.for_response()
    response = fingerprint_text("Here it is: " + " ".join(span) + " That was all.", key, answer)
    matches = [
        Match(int(o), 1, where[v])
        for v, o in zip(response.values.tolist(), response.offsets.tolist(), strict=True)
        if v in where
    ]
    view = Response(response.values, response.offsets, np.zeros(len(response.values), dtype=bool), answer)
    return is_finding(evaluate(view, matches, {1: params}, Budget()), t)  # as the matcher does


def main() -> None:
    print("request-level sampling (a leak is seen only if source and recipient were both kept)")
    print("| kept r | P(a leak is seen) | of the incident's 155 leaks, seen | P(at least one seen) |")
    print("|---:|---:|---:|---:|")
    for r in (1.0, 0.5, 0.25, 0.1, 0.05):
        p = r * r
        print(f"| {r} | {p:.4f} | {INCIDENT_LEAKS * p:.1f} | {1 - (1 - p) ** INCIDENT_LEAKS:.3f} |")
    rng = random.Random(3)
    corpus = [w for d in docstrings() for w in d]
    key = bytes(range(32))
    t = thresholds()
    filler = [f"{rng.getrandbits(24):06x}" for _ in range(70_000)]  # puts the corpus past sample_after
    prompt = " ".join(filler + corpus)
    sources = {}
    for mod in MODS:
        fp = fingerprint_text(prompt, key, Params(sample_after=65_536, sample_mod=mod))
        sources[mod] = (dict(zip(fp.values.tolist(), fp.offsets.tolist(), strict=True)), fp.token_count, len(fp))
    print(
        f"\ncontent-defined sampling past 65,536 tokens: share of leaked spans detected ({TRIALS} spans of "
        f"real text each, quoted from a {sources[1][1]:,}-token prompt)"
    )
    print("| span (words) | " + " | ".join(f"1/{m}" for m in MODS) + " |")
    print("|---:|" + "---:|" * len(MODS))
    starts = {span: [rng.randrange(len(corpus) - span) for _ in range(TRIALS)] for span in SPANS}
    for span in SPANS:
        row = []
        for mod in MODS:
            params = Params(sample_after=65_536, sample_mod=mod)
            hits = sum(detected(corpus[s : s + span], sources[mod][0], params, key, t) for s in starts[span])
            row.append(hits / TRIALS)
        print(f"| {span} | " + " | ".join(f"{x:.2f}" for x in row) + " |")
    print("| fingerprints of that prompt | " + " | ".join(f"{sources[m][2]:,}" for m in MODS) + " |")


if __name__ == "__main__":
    main()
