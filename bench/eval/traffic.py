"""Multi-tenant traffic with injected leaks, and the ground truth to score findings against.

Each tenant has its own passages for prompts and, apart from them, for answers: what a model
says is not what it was sent, so a leak of another tenant's *answer* (a decode GPU's pages hold
generated tokens too) shows only against that answer. Answers also carry stock phrases every
tenant gets, quotes of public text, and echoes of the tenant's own prompts.

Exchanges have the time they happened (``ts``) and an arrival order (``Traffic.order``): a
leak's source happened first, and in a share of the leaks arrives after its recipient. A share
of exchanges, leaked ones included, go on as a chat: a next turn whose prompt sends the whole
conversation back, the answer with whatever it carried.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SPANS = (8, 12, 16, 24, 32, 64, 128, 256, 512)
PERTURBATIONS = ("none", "case", "whitespace", "punctuation", "substitute", "interleave")
SOURCES = ("prompt", "response")
# What assistants say to everyone: common across tenants soon, never evidence of a leak.
STOCK = (
    "Sure, here is what you asked for.",
    "I hope this helps! Let me know if you have any other questions.",
    "Here is a summary of the main points:",
    "Please note that I cannot verify this information independently.",
    "Let me walk you through it step by step.",
    "If you need more detail on any of these points, just ask and I will expand on it.",
)


@dataclass
class Exchange:
    tenant: str
    request_id: str
    prompt: list[str]
    response: list[str]
    private: list[str] = field(default_factory=list)  # the prompt's tenant-owned part, leak material
    answer: list[str] = field(default_factory=list)  # the response's tenant-owned part, leak material
    ts: float = 0.0  # seconds from the start of the traffic: when it happened


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
    source_kind: str = "prompt"  # which text of the source exchange leaked


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
    response_share: float = 0.15,
    chat_share: float = 0.0,
) -> Traffic:
    """``leaks_per_cell`` leaks per span and perturbation, ``response_share`` of them of a source's answer;
    ``chat_share`` of all exchanges have a next turn (``next_turns``)."""
    rng = random.Random(seed)
    own = [passages[i::tenants] for i in range(tenants)]
    prompts = [pool[0::2] for pool in own]
    answers = [pool[1::2] for pool in own]
    names = [f"tenant-{i:03d}" for i in range(tenants)]
    history: dict[int, list[Exchange]] = {i: [] for i in range(tenants)}
    seq = 0

    def make(t: int) -> Exchange:
        nonlocal seq
        seq += 1
        pool = prompts[t]
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
        answer = [w for _ in range(rng.randint(1, 2)) for w in rng.choice(answers[t])]
        response = list(answer)
        if rng.random() < 0.3:  # self-echo: quote this prompt or an earlier one of the same tenant
            earlier = rng.choice(history[t]).private if history[t] and rng.random() < 0.5 else private
            start = rng.randrange(max(1, len(earlier) - 100))
            at = rng.randrange(len(response) + 1)
            response[at:at] = earlier[start : start + rng.randint(20, 100)]
        if rng.random() < 0.1:
            quote = rng.choice(public)
            start = rng.randrange(max(1, len(quote) - 80))
            response += quote[start : start + rng.randint(20, 80)]
        if rng.random() < 0.3:
            stock = rng.choice(STOCK).split()
            response = stock + response if rng.random() < 0.5 else response + stock
        ex = Exchange(names[t], f"{names[t]}-{seq:06d}", prompt, response, private, answer)
        history[t].append(ex)
        return ex

    order = [make(rng.randrange(tenants)) for _ in range(clean)]
    for i, ex in enumerate(order):
        ex.ts = float(i)
    leaks = []
    for span in SPANS:
        for kind in PERTURBATIONS:
            for _ in range(leaks_per_cell):
                a = rng.randrange(tenants)
                b = rng.choice([t for t in range(tenants) if t != a])
                source = make(a)
                source_kind = "response" if rng.random() < response_share else "prompt"
                material = source.answer if source_kind == "response" else source.private
                while len(material) < span + 10:
                    extra = rng.choice(answers[a] if source_kind == "response" else prompts[a])
                    material += extra
                    (source.response if source_kind == "response" else source.prompt).extend(extra)
                start = rng.randrange(len(material) - span)
                leaked = perturb(material[start : start + span], kind, rng, list(rng.choice(prompts[b])))
                recipient = make(b)
                cut = rng.randrange(len(recipient.response) + 1)
                recipient.response = recipient.response[:cut] + leaked + recipient.response[cut:]
                first = rng.random() < 0.3
                pos = rng.randrange(len(order) + 1)
                # Apart by a few batches, so the two sides usually arrive in different requests;
                # the source happened first, whichever arrives first.
                later = min(len(order), pos + rng.randint(50, 400))
                when = order[pos - 1].ts if pos else 0.0
                source.ts, recipient.ts = when + 0.25, when + 0.5
                order[pos:pos] = [recipient if first else source]
                order.insert(later, source if first else recipient)
                leaks.append(
                    Leak(
                        names[a],
                        source.request_id,
                        names[b],
                        recipient.request_id,
                        span,
                        kind,
                        first,
                        cut,
                        len(leaked),
                        source_kind,
                    )
                )
    turns = random.Random(seed + 1)  # its own stream: with no chat the traffic is what it was
    chats = next_turns(order, chat_share, turns, lambda t: turns.choice(prompts[t]), lambda t: turns.choice(answers[t]))
    return Traffic(chats, leaks, clean + len(chats) - len(order))


def next_turns(
    order: list[Exchange],
    share: float,
    rng: random.Random,
    question: Callable[[int], list[str]],
    answer: Callable[[int], list[str]],
) -> list[Exchange]:
    """``order`` with a next turn after ``share`` of its exchanges, 1 to 10 exchanges later: its prompt is
    the exchange's prompt and answer, sent back as a chat does, and a new question of the tenant's; its
    answer a new one. A leaked answer goes back to the service in a prompt of its recipient."""
    keyed: list[tuple[float, Exchange]] = []
    for i, ex in enumerate(order):
        keyed.append((i, ex))
        if rng.random() < share:
            t = int(ex.tenant.rsplit("-", 1)[1])
            ask, said = question(t), answer(t)
            later = rng.randint(1, 10)
            turn = Exchange(ex.tenant, f"{ex.request_id}-next", ex.prompt + ex.response + ask, list(said), ask, said)
            turn.ts = ex.ts + later
            keyed.append((i + later + 0.5, turn))
    keyed.sort(key=lambda k: k[0])
    return [ex for _, ex in keyed]


def wire(ex: Exchange) -> dict[str, Any]:
    return {
        "tenant": ex.tenant,
        "request_id": ex.request_id,
        "prompt": " ".join(ex.prompt),
        "response": " ".join(ex.response),
    }
