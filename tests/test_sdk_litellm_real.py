"""The LiteLLM callback inside the real ``litellm`` package, every call type it covers, plain and
streamed, against a fake upstream on loopback (no internet), reporting to a running bleedwatch.

LiteLLM is not a dependency of bleedwatch: it is installed in a venv of its own, cached once per
machine in ~/.cache/bleedwatch/test-venvs (tests/aux_venv.py), with the few packages its
Anthropic streaming path imports from its proxy. The test is skipped only when that install
fails, and the skip says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from service.auth.keys import Role
from tests.aux_venv import ROOT, SDK, SHARED_CACHE, NotInstallable, cached_venv, python, sdk_requirements
from tests.conftest import Served
from tests.traffic import KEY, TEXTS

LITELLM = "litellm==1.110.2"  # pinned: the callback's reading of its arguments is checked against this one
# What LiteLLM's Anthropic streaming imports from its proxy package, besides litellm itself.
LITELLM_PROXY_BITS = ["fastapi", "backoff", "redis", "soundfile"]
CASES = [
    "completion",
    "completion-stream",
    "acompletion",
    "acompletion-stream",
    "text_completion",
    "text_completion-stream",
    "atext_completion",
    "atext_completion-stream",
    "responses",
    "responses-stream",
    "aresponses",
    "aresponses-stream",
    "anthropic_messages",
    "anthropic_messages-stream",
]
SPAN = 60  # words of the source's prompt each case's answer recites


@pytest.fixture(scope="session")
def litellm_python() -> Path:
    try:
        venv_dir = cached_venv(
            "litellm", [LITELLM, *LITELLM_PROXY_BITS, *sdk_requirements()], [SDK / "pyproject.toml"], cache=SHARED_CACHE
        )
    except NotInstallable as exc:
        pytest.skip(f"litellm could not be installed in a venv of its own: {exc}")
    return python(venv_dir)


def source_words() -> list[str]:
    return [w for name in ("argparse", "subprocess", "unittest", "sqlite3", "socket") for w in TEXTS[name]]


@pytest.mark.parametrize("settings", ["embedded"], indirect=True)
def test_every_call_type_through_real_litellm_becomes_a_finding(
    litellm_python: Path, served: Served, tmp_path: Path
) -> None:
    words = source_words()
    assert len(words) >= SPAN * len(CASES), "not enough source text for distinct spans"
    recitals = {case: " ".join(words[i * SPAN : (i + 1) * SPAN]) for i, case in enumerate(CASES)}
    job = {
        "url": served.url,
        "token": served.tokens[Role.INGEST],
        "key": KEY.hex(),
        "spool_dir": str(tmp_path / "spool"),
        "source": " ".join(words[: SPAN * len(CASES)]),
        "recitals": recitals,
        "cases": CASES,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BLEEDWATCH_", "PYTHON"))}
    env |= {"PYTHONPATH": f"{SDK}:{ROOT}", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [litellm_python, str(ROOT / "tests" / "litellm_drive.py")],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["failed"] == {}
    assert (got["submitted"], got["errors"], got["dropped"]) == (1 + len(CASES), 0, 0), got
    assert got["accepted"] == 1 + len(CASES)
    assert got["clients"] == 1  # one per worker process, on the callback's own loop, for sync and async calls
    assert got["spool"] == str(tmp_path / "spool" / "worker-0.spool")

    headers = {"Authorization": f"Bearer {served.tokens[Role.READ]}"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=10) as http:
        deadline = time.monotonic() + 30
        while http.get("/v1/queue").json()["queued"]:
            assert time.monotonic() < deadline, "batches still queued"
            time.sleep(0.05)
        items = http.get("/v1/findings", params={"limit": 100}).json()["items"]
    found = {f["recipient_tenant"]: f["source_tenant"] for f in items}
    assert found == {f"team-{case}": "team-source" for case in CASES}
