"""bleedwatch-sdk as a gateway gets it: the wheel built from sdk/, installed alone in a fresh venv.

The venv holds the SDK's three dependencies and nothing of the server (cached in .cache/venvs,
keyed on sdk/pyproject.toml; the wheel itself is rebuilt and reinstalled every run, offline).
Inside it, in isolated mode (neither this checkout nor PYTHONPATH on sys.path), ``import
bleedwatch`` must work with FastAPI and SQLAlchemy absent, and a 1,000-token exchange must be
fingerprinted and accepted by a running bleedwatch on a loopback port.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bleedwatch import fingerprint_text
from service.auth.keys import Role
from tests.aux_venv import SDK, build_sdk_wheel, cached_venv, closure_mb, python, sdk_requirements, site_packages
from tests.conftest import Served
from tests.traffic import KEY, TEXTS

# Run in the fresh venv. Nothing of the server may be importable, and nothing of this checkout.
GATEWAY = r"""
import asyncio, importlib.util, json, sys
absent = ["fastapi", "sqlalchemy", "starlette", "pydantic", "uvicorn", "alembic", "psycopg", "redis", "service"]
present = [m for m in absent if importlib.util.find_spec(m) is not None]
assert not present, f"server packages importable beside the SDK: {present}"
import bleedwatch
from bleedwatch import BleedwatchClient, fingerprint_text
assert "site-packages" in bleedwatch.__file__, bleedwatch.__file__
job = json.load(sys.stdin)
key = bytes.fromhex(job["key"])

async def main():
    async with BleedwatchClient(job["url"], job["token"], wait_for_processing=True) as bw:
        await bw.submit_text(job["prompt"], job["response"], key=key, tenant="gateway-wheel",
                             request_id="wheel-1", model="m-1", meta={"deployment": "pd-1", "node": "n-1"})
        await bw.flush()
        return bw.accepted, bw.dropped
accepted, dropped = asyncio.run(main())
print(json.dumps({
    "accepted": accepted, "dropped": dropped,
    "prompt_tokens": fingerprint_text(job["prompt"], key).token_count,
    "modules": sorted({m.split(".")[0] for m in sys.modules}),
}))
"""


@pytest.fixture(scope="session")
def sdk_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv_dir = cached_venv("sdk", sdk_requirements(), [SDK / "pyproject.toml"])
    wheel = build_sdk_wheel(tmp_path_factory.mktemp("wheel"))
    subprocess.run(
        [python(venv_dir), "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return venv_dir


def thousand_tokens() -> str:
    """A prompt of at least 1,000 tokens (as the scheme counts them) from real text."""
    words = [w for name in sorted(TEXTS) for w in TEXTS[name]]
    for n in range(1000, len(words), 50):
        if fingerprint_text(" ".join(words[:n]), KEY).token_count >= 1000:
            return " ".join(words[:n])
    raise AssertionError("the test texts hold fewer than 1,000 tokens")


@pytest.mark.parametrize("settings", ["embedded"], indirect=True)
def test_the_wheel_alone_fingerprints_and_posts_a_1000_token_exchange(sdk_venv: Path, served: Served) -> None:
    job = {
        "url": served.url,
        "token": served.tokens[Role.INGEST],
        "key": KEY.hex(),
        "prompt": thousand_tokens(),
        "response": " ".join(TEXTS["json"][:200]),
    }
    done = subprocess.run(
        [python(sdk_venv), "-I", "-c", GATEWAY], input=json.dumps(job), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got["accepted"], got["dropped"]) == (1, 0)
    assert got["prompt_tokens"] >= 1000
    assert not {"fastapi", "sqlalchemy", "pydantic", "service"} & set(got["modules"])


def test_install_size_of_the_sdk_against_the_server(sdk_venv: Path) -> None:
    """Printed for the record (pytest -s, or the -ra summary); docs/performance.md has the figures."""
    sdk_mb, sdk_dists = closure_mb(python(sdk_venv), "bleedwatch-sdk")
    server_mb, server_dists = closure_mb(sys.executable, "bleedwatch-server")
    fresh = sum(f.stat().st_size for f in site_packages(sdk_venv).rglob("*") if f.is_file()) / 1e6
    print(
        f"\ninstall size: bleedwatch-sdk {sdk_mb:.1f} MB ({sdk_dists} distributions; fresh venv site-packages "
        f"{fresh:.1f} MB with pip), server {server_mb:.1f} MB ({server_dists} distributions, no extras)"
    )
    assert sdk_dists <= 10  # bleedwatch-sdk, numpy, httpx, orjson and httpx's own few
    assert sdk_mb < server_mb / 2
