"""Tenants' traffic for the simulator: a reproducible plan of prompts, some longer than the KV pool."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from service.tools.sim.corpus import prompt, tenant_words
from service.tools.sim.openai_wire import StreamReader


@dataclass(frozen=True, slots=True)
class Planned:
    tenant: str
    words: int
    start: int
    stream: bool
    over_pool: bool

    def text(self) -> str:
        return prompt(self.tenant, self.words, self.start)


@dataclass(frozen=True, slots=True)
class Sent:
    planned: Planned
    status: int
    request_id: str | None
    node: str | None
    content: str
    error: str | None


def plan(
    tenants: Sequence[str],
    requests: int,
    over_pool: int,
    pool_tokens: int,
    context_length: int,
    seed: int = 0,
) -> list[Planned]:
    """``requests`` prompts round-robin over the tenants (in a shuffled order each round).

    ``over_pool`` of them, never among the first few, are longer than the pool but within the
    context length: the requests the incident's engine answered from other tenants' pages.
    """
    if over_pool and pool_tokens >= context_length:
        raise ValueError("no prompt can be over the pool and within the context length")
    rng = random.Random(seed)
    first = min(len(tenants), max(0, requests - over_pool))
    over = set(rng.sample(range(first, requests), min(over_pool, requests - first)))
    out: list[Planned] = []
    order: list[str] = []
    for i in range(requests):
        if not order:
            order = list(tenants)
            rng.shuffle(order)
        tenant = order.pop()
        if i in over:
            words = rng.randint(pool_tokens + 1, min(context_length, int(pool_tokens * 1.8)))
        else:
            words = rng.randint(max(1, pool_tokens // 8), max(1, int(pool_tokens * 0.9)))
        words = min(words, len(tenant_words(tenant)))
        start = rng.randrange(len(tenant_words(tenant)))
        out.append(Planned(tenant, words, start, stream=rng.random() < 0.5, over_pool=i in over))
    return out


async def send(
    client: httpx.AsyncClient, planned: Sequence[Planned], model: str, keys: Mapping[str, str]
) -> list[Sent]:
    """Each planned prompt as a chat completion from its tenant's key; ``keys`` maps tenant to key."""
    out = []
    for p in planned:
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": p.text()}]}
        headers = {"Authorization": f"Bearer {keys[p.tenant]}"}
        if p.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}  # the engine's prompt token count, for bleedwatch
            async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    out.append(Sent(p, resp.status_code, None, None, "", _error(resp)))
                    continue
                reader = StreamReader()
                async for line in resp.aiter_lines():
                    reader.feed(line)
                out.append(Sent(p, 200, reader.request_id, resp.headers.get("x-sim-node"), reader.content, None))
        else:
            resp = await client.post("/v1/chat/completions", json=body, headers=headers)
            if resp.status_code != 200:
                out.append(Sent(p, resp.status_code, None, None, "", _error(resp)))
                continue
            data = resp.json()
            content = data["choices"][0]["message"]["content"]
            out.append(Sent(p, 200, data["id"], resp.headers.get("x-sim-node"), content, None))
    return out


def _error(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return resp.text[:200]
