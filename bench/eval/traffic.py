"""Multi-tenant traffic with injected leaks, and the ground truth to score findings against."""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from typing import Any

SPANS = (8, 12, 16, 24, 32, 64, 128, 256, 512)
PERTURBATIONS = ("none", "case", "whitespace", "punctuation", "substitute", "interleave")


@dataclass
class Exchange:
    tenant: str
    request_id: str
    prompt: list[str]
    response: list[str]
    private: list[str] = field(default_factory=list)  # the prompt's tenant-owned part, leak material


@dataclass(frozen=True, slots=True)
class Leak:
    source_tenant: str
    source_request: str
    recipient_tenant: str
    recipient_request: str
    span: int
    perturbation: str
    recipient_first: bool
    at: int = 0  # where the leaked words sit in the recipient's response: words [at, at + words)
    words: int = 0


@dataclass
class Traffic:
    order: list[Exchange]
    leaks: list[Leak]
    clean: int


def perturb(words: list[str], kind: str, rng: random.Random, filler: list[str]) -> list[str]:
    if kind == "case":
        return [rng.choice((str.upper, str.lower, str.title))(w) for w in words]
    if kind == "whitespace":
        return [w + rng.choice(("\n", "  ", "\t", "\n\n")) for w in words]
    if kind == "punctuation":
        out = []
        for w in words:
            w = w.strip(string.punctuation) or w
            out.append(w + rng.choice(("", "", ",", ";", ".", " -", ":")))
        return out
    if kind == "substitute":
        out = list(words)
        for block in range(0, len(out), 30):
            i = rng.randrange(block, min(block + 30, len(out)))
            out[i] = rng.choice(filler)
        return out
    if kind == "interleave":
        cuts = sorted(rng.sample(range(1, len(words)), k=min(2, len(words) - 1)))
        parts = [words[a:b] for a, b in zip([0, *cuts], [*cuts, len(words)], strict=True)]
        out = []
        for part in parts:
            out += part + filler[: rng.randint(10, 30)]
            rng.shuffle(filler)
        return out
    return list(words)


def generate(
    passages: list[list[str]],
    public: list[list[str]],
    templates: list[str],
    *,
    tenants: int,
    clean: int,
    leaks_per_cell: int,
    long_share: float,
    seed: int,
) -> Traffic:
    rng = random.Random(seed)
    pools = [passages[i::tenants] for i in range(tenants)]
    names = [f"tenant-{i:03d}" for i in range(tenants)]
    history: dict[int, list[Exchange]] = {i: [] for i in range(tenants)}
    seq = 0

    def make(t: int) -> Exchange:
        nonlocal seq
        seq += 1
        pool = pools[t]
        if rng.random() < long_share:
            private = [w for _ in range(rng.randint(60, 200)) for w in rng.choice(pool)]
        else:
            private = [w for _ in range(rng.randint(1, 4)) for w in rng.choice(pool)]
        prompt = templates[t % len(templates)].split()
        if rng.random() < 0.2:
            quote = rng.choice(public)
            start = rng.randrange(max(1, len(quote) - 150))
            prompt += quote[start : start + rng.randint(30, 150)]
        prompt += private
        response = [w for _ in range(rng.randint(1, 2)) for w in rng.choice(pool)]
        if rng.random() < 0.3:  # self-echo: quote this prompt or an earlier one of the same tenant
            earlier = rng.choice(history[t]).private if history[t] and rng.random() < 0.5 else private
            start = rng.randrange(max(1, len(earlier) - 100))
            at = rng.randrange(len(response) + 1)
            response[at:at] = earlier[start : start + rng.randint(20, 100)]
        if rng.random() < 0.1:
            quote = rng.choice(public)
            start = rng.randrange(max(1, len(quote) - 80))
            response += quote[start : start + rng.randint(20, 80)]
        ex = Exchange(names[t], f"{names[t]}-{seq:06d}", prompt, response, private)
        history[t].append(ex)
        return ex

    order = [make(rng.randrange(tenants)) for _ in range(clean)]
    leaks = []
    for span in SPANS:
        for kind in PERTURBATIONS:
            for _ in range(leaks_per_cell):
                a = rng.randrange(tenants)
                b = rng.choice([t for t in range(tenants) if t != a])
                source = make(a)
                while len(source.private) < span + 10:
                    extra = rng.choice(pools[a])
                    source.private += extra
                    source.prompt += extra
                start = rng.randrange(len(source.private) - span)
                leaked = perturb(source.private[start : start + span], kind, rng, list(rng.choice(pools[b])))
                recipient = make(b)
                cut = rng.randrange(len(recipient.response) + 1)
                recipient.response = recipient.response[:cut] + leaked + recipient.response[cut:]
                first = rng.random() < 0.3
                pos = rng.randrange(len(order) + 1)
                pair = [recipient, source] if first else [source, recipient]
                # Apart by a few batches, so the two sides usually arrive in different requests.
                order[pos:pos] = [pair[0]]
                order.insert(min(len(order), pos + rng.randint(50, 400)), pair[1])
                leaks.append(
                    Leak(
                        names[a], source.request_id, names[b], recipient.request_id, span, kind, first, cut, len(leaked)
                    )
                )
    return Traffic(order, leaks, clean)


def wire(ex: Exchange) -> dict[str, Any]:
    return {
        "tenant": ex.tenant,
        "request_id": ex.request_id,
        "prompt": " ".join(ex.prompt),
        "response": " ".join(ex.response),
    }
