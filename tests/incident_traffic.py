"""Leaks for the incident tests: one tenant's prompt text in another tenant's answer, on demand."""

from __future__ import annotations

import itertools
from typing import Any

from service.auth.keys import Role
from tests.conftest import Api
from tests.traffic import exchange, words

_ids = itertools.count()


def leak_pair(
    text: str,
    source: str,
    recipient: str,
    ts: float,
    *,
    model: str = "m-1m",
    deployment: str = "pd-eu-1",
    node: str = "decode-3",
    prompt_tokens: int | None = 700_001,
    length: int = 40,
) -> tuple[list[dict[str, Any]], str]:
    """``source`` sends module docstring ``text`` in a prompt; ``recipient``'s answer carries ``length``
    words of it (40: severity high). Returns the two exchanges and the recipient's request id."""
    n = next(_ids)
    meta: dict[str, Any] = {"deployment": deployment, "node": node}
    src = exchange(source, f"s-{n}", words(text), "Sure, here is a summary.", ts - 1, **meta)
    if prompt_tokens is not None:
        meta["prompt_tokens"] = prompt_tokens
    rid = f"r-{n}"
    answer = "Here you go. " + words(text, 60, 60 + length) + " Anything else?"
    dst = exchange(recipient, rid, words("unittest", 100, 140), answer, ts, **meta)
    for ex in (src, dst):
        ex["model"] = model
    return [src, dst], rid


async def post(api: Api, exchanges: list[dict[str, Any]]) -> dict[str, Any]:
    resp = await api.client.post("/v1/exchanges", json={"exchanges": exchanges}, headers=api.headers(Role.INGEST))
    assert resp.status_code == 202, resp.text
    result: dict[str, Any] = resp.json()
    return result


async def leak(api: Api, text: str, source: str, recipient: str, ts: float, **kw: Any) -> str:
    exchanges, rid = leak_pair(text, source, recipient, ts, **kw)
    result = await post(api, exchanges)
    assert result["findings"] == 1, result
    return rid


async def get(api: Api, path: str, role: Role = Role.READ, **params: Any) -> Any:
    resp = await api.client.get(path, params=params, headers=api.headers(role))
    assert resp.status_code == 200, resp.text
    return resp.json()


async def patch(api: Api, path: str, body: dict[str, Any], role: Role = Role.TRIAGE, status: int = 200) -> Any:
    resp = await api.client.patch(path, json=body, headers=api.headers(role))
    assert resp.status_code == status, resp.text
    return resp.json()


def key_id(api: Api, role: Role) -> str:
    return api.tokens[role].split("_")[1]
