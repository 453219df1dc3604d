"""Hard negatives: pairs of different real documents that share a short phrase, and no leak.

    .venv/bin/python -m bench.eval.hardneg                 # mine the pairs, replay them, count findings
    .venv/bin/python -m bench.eval.hardneg --explain 20    # and print the text behind the findings

The evaluation corpus (bench/eval/corpus.py) drops every passage that shares 8 tokens with
another, in a row or around an edit of up to 2 tokens, so its clean traffic has no coincidental
overlap of the length a finding needs: a looser threshold would show no false positive there for
the wrong reason. This set is that overlap, on purpose. Every finding on it is a false positive.

Text, all shipped with Python or Debian: stdlib docstrings, the Python reference topics, Debian
changelogs (the same 3M words the evaluation uses) and /usr/share/common-licenses. Each text has
an *origin* (a docstring, a topic, a package's changelog, a license file); a pair takes two
passages of different origins that share tokens, and is put in a stratum by the longest run of
tokens the two have in common, in a row (``L``):

- ``edit``: the near-copy criterion of corpus.py without 8 in a row: 8 tokens around an edit of
  up to 2 tokens ("fix race when deleting free space / quota root from the dirty cow roots list"),
- ``6-7``, ``8-9``, ``10-11``, ``12-15``: a phrase of that many tokens in common;
- ``dropped``: pairs corpus.py dropped for the evaluation (a passage and the kept one it
  collided with) with fewer than 16 tokens in a row in common.

Pairs with 16 or more tokens in a row in common are left out: that is text copied from one to
the other (or from a common upstream), which a detector of copied text must report, and what the
evaluation calls a 16-word leak. Per stratum at most two pairs share one longest phrase, so one
stock line ("bump standards version to 4.x.y, no changes needed") does not fill it, and
``--per-stratum`` pairs are changelog/changelog, as many again (if there are) the other texts.
Changelog pairs never share a source package (libc6 and libc-bin ship glibc's one changelog).

Each pair is replayed in both directions (one tenant's prompt is the one text, another tenant's
answer the other) under a fingerprint key of its own, so nothing else in the index makes its
phrase common, and without an allowlist: the strictest condition for the thresholds, since in
real traffic a phrase sent by three tenants is suppressed as common.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from bench.corpus import docstrings
from bench.eval.corpus import PASSAGE_WORDS, _changelogs_by_package, _pydoc_topics, near_copy_keys
from bench.eval.run import all_findings
from bench.service import running_service
from bleedwatch.client import BleedwatchClient
from bleedwatch.exchange import fingerprint_exchange
from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS, Params
from bleedwatch.fingerprint.tokens import tokenize

STRATA = ("edit", "6-7", "8-9", "10-11", "12-15", "dropped")
MAX_COMMON_RUN = 15  # 16 tokens in a row in common is a copy, not a shared phrase
GRAM = 4
# A 4-gram in more passages than this is stock phrasing ("if this is not"): its pairs are
# sampled, not enumerated.
MAX_POSTINGS = 40


@dataclass(frozen=True, slots=True)
class Passage:
    origin: str
    words: list[str]
    tokens: list[str]


@dataclass(frozen=True, slots=True)
class Pair:
    stratum: str
    a: int
    b: int
    common: int  # longest run of tokens in common, in a row
    phrase: str  # that run


def _cut(words: list[str], rng: random.Random) -> list[list[str]]:
    out, i = [], 0
    while i < len(words):
        size = rng.randint(*PASSAGE_WORDS)
        piece = words[i : i + size]
        if len(piece) >= PASSAGE_WORDS[0] // 2:
            out.append(piece)
        i += size
    return out


def passages(seed: int, changelog_words: int) -> list[Passage]:
    rng = random.Random(seed)
    out: list[Passage] = []

    def add(origin: str, words: list[str]) -> None:
        for piece in _cut(words, rng):
            out.append(Passage(origin, piece, tokenize(" ".join(piece))))

    for i, words in enumerate(docstrings()):
        add(f"doc:{i}", words)
    for i, words in enumerate(_pydoc_topics()):
        add(f"topic:{i}", words)
    for package, entries in _changelogs_by_package(changelog_words):
        for words in entries:
            add(f"changelog:{package}", words)
    for path in sorted(Path("/usr/share/common-licenses").glob("*")):
        if path.is_file() and not path.is_symlink():
            add(f"license:{path.name}", path.read_text(errors="replace").split())
    return out


def longest_common(a: list[str], b: list[str]) -> tuple[int, int]:
    """Length and start in ``a`` of the longest run of tokens ``a`` and ``b`` have in common (0 under 4)."""
    where: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for j in range(len(b) - GRAM + 1):
        where[tuple(b[j : j + GRAM])].append(j)
    best, at = 0, 0
    for i in range(len(a) - GRAM + 1):
        for j in where.get(tuple(a[i : i + GRAM]), ()):
            if i and j and a[i - 1] == b[j - 1]:
                continue  # not the start of a run
            k = GRAM
            while i + k < len(a) and j + k < len(b) and a[i + k] == b[j + k]:
                k += 1
            if k > best:
                best, at = k, i
    return best, at


def _stratum(common: int, edit: bool) -> str | None:
    if common >= 16:
        return None
    if common >= 12:
        return "12-15"
    if common >= 10:
        return "10-11"
    if common >= 8:
        return "8-9"
    if edit:
        return "edit"
    if common >= 6:
        return "6-7"
    return None


def mine(texts: list[Passage], per_stratum: int, seed: int) -> list[Pair]:
    """Pairs of passages of different origins that share a phrase, stratified (module docstring)."""
    rng = random.Random(seed)
    postings: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for i, p in enumerate(texts):
        # dict.fromkeys, not a set: the order of a set of strings changes with the hash seed.
        for g in dict.fromkeys(tuple(p.tokens[k : k + GRAM]) for k in range(len(p.tokens) - GRAM + 1)):
            postings[g].append(i)
    candidates: set[tuple[int, int]] = set()
    for docs in postings.values():
        if len(docs) < 2:
            continue
        if len(docs) > MAX_POSTINGS:
            docs = rng.sample(docs, MAX_POSTINGS)
        for x in range(len(docs)):
            for y in range(x + 1, len(docs)):
                a, b = docs[x], docs[y]
                if texts[a].origin != texts[b].origin:
                    candidates.add((a, b))
    print(f"  {len(candidates)} candidate pairs", file=sys.stderr)
    order = sorted(candidates)
    rng.shuffle(order)
    out: list[Pair] = []
    full: Counter[tuple[str | None, bool]] = Counter()
    keys: dict[int, set[tuple[str, ...]]] = {}

    def near(i: int) -> set[tuple[str, ...]]:
        if i not in keys:
            keys[i] = near_copy_keys(texts[i].tokens)
        return keys[i]

    per_phrase: Counter[tuple[str, str]] = Counter()
    for a, b in order:
        ta, tb = texts[a].tokens, texts[b].tokens
        common, at = longest_common(ta, tb)
        edit = common < 8 and not near(a).isdisjoint(near(b))
        stratum = _stratum(common, edit)
        # Changelogs are most of the text: the other texts get a quota of their own.
        group = (stratum, texts[a].origin.startswith("changelog:") and texts[b].origin.startswith("changelog:"))
        if stratum is None or full[group] >= per_stratum:
            continue
        phrase = " ".join(ta[at : at + common])
        if per_phrase[(stratum, phrase)] >= 2:
            continue
        per_phrase[(stratum, phrase)] += 1
        full[group] += 1
        out.append(Pair(stratum, a, b, common, phrase))
    return out


def dropped_pairs(seed: int, changelog_words: int, per_stratum: int) -> list[tuple[list[str], list[str], int]]:
    """Passages corpus.private_passages drops, each with the kept passage it collided with, and the
    longest run of tokens they have in common; only those under 16 (near-copies, not copies), at
    most two per phrase."""
    from bench.eval.corpus import _changelogs, _passages

    rng = random.Random(seed)
    candidates = _passages(docstrings() + _pydoc_topics() + _changelogs(changelog_words), rng)
    rng.shuffle(candidates)
    owner: dict[tuple[str, ...], int] = {}
    kept: list[list[str]] = []
    out: list[tuple[list[str], list[str], int]] = []
    per_phrase: Counter[str] = Counter()
    for words in candidates:
        tokens = tokenize(" ".join(words))
        keys = near_copy_keys(tokens)
        hit = min((owner[k] for k in keys if k in owner), default=None)
        if hit is not None:
            other = tokenize(" ".join(kept[hit]))
            common, at = longest_common(other, tokens)
            phrase = " ".join(other[at : at + common])
            if common <= MAX_COMMON_RUN and per_phrase[phrase] < 2 and len(out) < per_stratum:
                per_phrase[phrase] += 1
                out.append((kept[hit], words, common))
            continue
        for k in keys:
            owner[k] = len(kept)
        kept.append(words)
    return out


async def replay(url: str, token: str, cases: list[tuple[str, str]], seed: int, params: Params) -> None:
    """Each case in both directions, each direction under a key of its own (else the one text would
    match itself across the two)."""
    rng = random.Random(seed)
    # Waits for each batch to be processed, so that the findings are all there when it returns.
    async with BleedwatchClient(url, token, batch_size=100, flush_seconds=3600, wait_for_processing=True) as client:
        for i, (x, y) in enumerate(cases):
            for d, (prompt, response) in enumerate(((x, y), (y, x))):
                key = rng.randbytes(32)
                for tenant, p, r in ((f"hn{i}-{d}a", prompt, "noted"), (f"hn{i}-{d}b", "go on", response)):
                    await client.submit(
                        fingerprint_exchange(
                            p,
                            r,
                            key=key,
                            tenant=tenant,
                            request_id=f"{tenant}-r",
                            model="hardneg",
                            ts=time.time(),
                            params=params,
                        )
                    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--per-stratum", type=int, default=400)
    p.add_argument("--changelog-words", type=int, default=3_000_000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--n", type=int, default=DEFAULT_PARAMS.n)
    p.add_argument("--w", type=int, default=DEFAULT_PARAMS.w)
    p.add_argument("--json", type=Path)
    p.add_argument("--explain", type=int, default=0, help="print the text behind this many findings")
    args = p.parse_args()

    print("mining pairs ...", file=sys.stderr)
    texts = passages(args.seed, args.changelog_words)
    pairs = mine(texts, args.per_stratum, args.seed)
    cases = [(" ".join(texts[x.a].words), " ".join(texts[x.b].words)) for x in pairs]
    strata = [x.stratum for x in pairs]
    for a, b, _ in dropped_pairs(args.seed, args.changelog_words, args.per_stratum):
        cases.append((" ".join(a), " ".join(b)))
        strata.append("dropped")
    params = replace(DEFAULT_PARAMS, n=args.n, w=args.w)
    print(f"replaying {len(cases)} pairs ...", file=sys.stderr)
    # Every case has a key id of its own, so ~12,000 namespaces of ~100 fingerprints: at the default
    # 2^16 buckets their presence filters (16 KB per shard touched) took Redis past 20 GB. One bucket
    # per shard keeps them small; what the index answers does not depend on its layout. Two tenants
    # per direction, ~12,000 in all from one key: past the limit on new tenants a key may bring.
    with running_service(index_bucket_bits="8", new_tenants_per_key_per_minute="0") as service:
        asyncio.run(replay(service.url, service.key("ingest"), cases, args.seed, params))
        findings = all_findings(service)
    flagged: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for f in findings:
        flagged[int(f["recipient_tenant"][2:].split("-")[0])].append(f)
    total: Counter[str] = Counter(strata)
    hit: Counter[str] = Counter(strata[i] for i in flagged)
    lines = [
        f"hard negatives: {len(cases)} pairs of different documents sharing a phrase, both directions; "
        f"n={args.n} w={args.w}",
        "",
        "| stratum (tokens in common, in a row) | pairs | pairs flagged |",
        "|---|---:|---:|",
    ]
    for s in STRATA:
        lines.append(f"| {s} | {total[s]} | {hit[s]} |")
    lines.append(f"| all | {len(cases)} | {len(flagged)} |")
    print("\n".join(lines))
    if args.explain:
        for i in sorted(flagged)[: args.explain]:
            x, y = cases[i]
            for f in flagged[i]:
                d = int(f["recipient_tenant"].split("-")[1][0])
                response = tokenize(x if d else y)
                source = tokenize(y if d else x)
                for src in f["evidence"]["sources"]:
                    for r in src["ranges"]:
                        a, b = r["response"]
                        sa, sb = r["source"]
                        print(
                            f"- [{strata[i]}] fp={r['fingerprints']}: "
                            f"{' '.join(response[a:b])!r} ~ {' '.join(source[sa:sb])!r}"
                        )
    if args.json:
        args.json.write_bytes(
            orjson.dumps(
                {
                    "strata": {s: [total[s], hit[s]] for s in STRATA},
                    "flagged": [
                        {"stratum": strata[i], "findings": len(fs), "longest": [f["longest_run_tokens"] for f in fs]}
                        for i, fs in sorted(flagged.items())
                    ],
                },
                option=orjson.OPT_INDENT_2,
            )
        )


if __name__ == "__main__":
    main()
