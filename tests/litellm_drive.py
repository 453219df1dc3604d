"""Drives the real ``litellm`` package through every call type the bleedwatch callback covers,
plain and streamed, against the fake upstream (tests/litellm_upstream.py), with the callback
registered the way a proxy registers it. Runs inside the LiteLLM venv, with sdk/ and the checkout on
PYTHONPATH; reads its job as JSON on stdin and prints what the callback did as JSON.

Each case is a team of its own (``metadata.user_api_key_team_id``, what the proxy's auth sets)
whose answer recites a different span of the source team's prompt: the test then expects one
finding per case, source ``team-source``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price list

import litellm

from bleedwatch.litellm import BleedwatchLogger
from tests import litellm_upstream

OPENAI_MODEL = "openai/gpt-4o-mini"
TEXT_MODEL = "openai/gpt-3.5-turbo-instruct"
ANTHROPIC_MODEL = "anthropic/claude-sonnet-4-20250514"


def drain_sync(result: Any) -> None:
    for _ in result:
        pass


async def drain_async(result: Any) -> None:
    async for _ in result:
        pass


async def run(job: dict[str, Any]) -> dict[str, Any]:
    url, _server = litellm_upstream.start()
    openai = {"api_base": url + "/v1", "api_key": "sk-fake"}
    anthropic = {"api_base": url, "api_key": "sk-ant-fake"}
    logger = BleedwatchLogger(
        job["url"], job["token"], bytes.fromhex(job["key"]), spool_dir=job["spool_dir"], flush_seconds=0.2
    )
    litellm.callbacks = [logger]

    def team(case: str) -> dict[str, Any]:
        return {"metadata": {"user_api_key_team_id": f"team-{case}"}}

    def chat(case: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"please recite:{case}"}]

    litellm_upstream.RECITALS.update(job["recitals"])
    source = [{"role": "user", "content": job["source"]}]
    await litellm.acompletion(model=OPENAI_MODEL, messages=source, **openai, **team("source"))

    cases: dict[str, Callable[[str], Awaitable[None] | None]] = {
        "completion": lambda c: litellm.completion(model=OPENAI_MODEL, messages=chat(c), **openai, **team(c)),
        "completion-stream": lambda c: drain_sync(
            litellm.completion(model=OPENAI_MODEL, messages=chat(c), stream=True, **openai, **team(c))
        ),
        "acompletion": lambda c: litellm.acompletion(model=OPENAI_MODEL, messages=chat(c), **openai, **team(c)),
        "acompletion-stream": lambda c: _then(
            litellm.acompletion(model=OPENAI_MODEL, messages=chat(c), stream=True, **openai, **team(c))
        ),
        "text_completion": lambda c: litellm.text_completion(
            model=TEXT_MODEL, prompt=f"please recite:{c}", **openai, **team(c)
        ),
        "text_completion-stream": lambda c: drain_sync(
            litellm.text_completion(model=TEXT_MODEL, prompt=f"please recite:{c}", stream=True, **openai, **team(c))
        ),
        "atext_completion": lambda c: litellm.atext_completion(
            model=TEXT_MODEL, prompt=f"please recite:{c}", **openai, **team(c)
        ),
        "atext_completion-stream": lambda c: _then(
            litellm.atext_completion(model=TEXT_MODEL, prompt=f"please recite:{c}", stream=True, **openai, **team(c))
        ),
        "responses": lambda c: litellm.responses(model=OPENAI_MODEL, input=f"please recite:{c}", **openai, **team(c)),
        "responses-stream": lambda c: drain_sync(
            litellm.responses(model=OPENAI_MODEL, input=f"please recite:{c}", stream=True, **openai, **team(c))
        ),
        "aresponses": lambda c: litellm.aresponses(model=OPENAI_MODEL, input=f"please recite:{c}", **openai, **team(c)),
        "aresponses-stream": lambda c: _then(
            litellm.aresponses(model=OPENAI_MODEL, input=f"please recite:{c}", stream=True, **openai, **team(c))
        ),
        "anthropic_messages": lambda c: litellm.anthropic.messages.acreate(
            model=ANTHROPIC_MODEL, messages=chat(c)[1:], max_tokens=200, **anthropic, **team(c)
        ),
        "anthropic_messages-stream": lambda c: _then(
            litellm.anthropic.messages.acreate(
                model=ANTHROPIC_MODEL, messages=chat(c)[1:], max_tokens=200, stream=True, **anthropic, **team(c)
            )
        ),
    }
    failed: dict[str, str] = {}
    for case in job["cases"]:
        try:
            result = cases[case](case)
            if result is not None and hasattr(result, "__await__"):
                await result
        except Exception as exc:
            failed[case] = f"{type(exc).__name__}: {exc}"[:300]
    # LiteLLM runs success callbacks in the background (tasks, and threads for sync calls).
    deadline = time.monotonic() + 30
    expected = 1 + len(job["cases"]) - len(failed)
    while logger.submitted < expected and time.monotonic() < deadline:  # noqa: ASYNC110 - a counter, no event
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # a second report of the same call, if LiteLLM makes one, is counted as skipped
    await logger.flush()
    accepted = sum(c.accepted for c in logger._clients.values())
    dropped = sum(c.dropped for c in logger._clients.values())
    spool = str(logger._spool) if logger._spool else None
    clients = len(logger._clients)
    await logger.aclose()
    return {
        "submitted": logger.submitted,
        "errors": logger.errors,
        "accepted": accepted,
        "dropped": dropped,
        "clients": clients,
        "spool": spool,
        "failed": failed,
        "litellm": litellm.__version__ if hasattr(litellm, "__version__") else None,
    }


async def _then(started: Awaitable[Any]) -> None:
    await drain_async(await started)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(json.load(sys.stdin)))))
