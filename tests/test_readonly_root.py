"""The pods of deploy/kubernetes/ run with a read-only root filesystem and write only to their
emptyDirs (/tmp, and the API's /tmp/bleedwatch-metrics). Checked for real: a private mount
namespace remounts / read-only and mounts those two as tmpfs, then tests/readonly_stack.py runs
migrate, serve and work in it and sends a leak through. Needs root (to mount in a namespace of
its own, as CI runs); skipped elsewhere. It runs as root there: the image's non-root uid is
set by the Dockerfile and the manifests (tests/test_kubernetes.py), not exercised here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import psycopg
import pytest

from tests.conftest import DATABASE_URL, REDIS_URL, _drop_prefix
from tests.observability import ROOT

# $0 is the interpreter, $1 the checkout. A checkout under /tmp (a CI clone) would vanish under the
# tmpfs that stands for the pod's /tmp: the old /tmp is kept at /mnt and the checkout bound back, read-only.
NAMESPACE = (
    "set -e; mount --make-rprivate / ; mount --bind / / ; mount -o remount,bind,ro / ; "
    'case "$1" in /tmp/*) mount --bind /tmp /mnt ;; esac ; '
    "mount -t tmpfs -o size=64m tmpfs /tmp ; mkdir /tmp/bleedwatch-metrics ; "
    "mount -t tmpfs -o size=16m tmpfs /tmp/bleedwatch-metrics ; "
    'case "$1" in /tmp/*) mkdir -p "$1" ; mount --bind "/mnt${1#/tmp}" "$1" ; '
    'mount -o remount,bind,ro "$1" ;; esac ; cd / ; '
    'exec "$0" -m tests.readonly_stack'
)


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"bw_readonly_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(DATABASE_URL, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE SCHEMA "{name}"')
        yield name
        admin.execute(f'DROP SCHEMA "{name}" CASCADE')


def test_migrate_serve_and_work_with_a_read_only_root(schema: str) -> None:
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("needs root and unshare to mount a read-only root in a namespace of its own")
    sep = "&" if "?" in DATABASE_URL else "?"
    prefix = f"ro{uuid.uuid4().hex[:8]}"
    env = {
        "PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": "/nonexistent",
        "BLEEDWATCH_DATABASE_URL": f"{DATABASE_URL}{sep}options={quote(f'-csearch_path={schema}')}",
        "BLEEDWATCH_REDIS_URL": REDIS_URL,
        "BLEEDWATCH_KEY_PREFIX": prefix,
        "BLEEDWATCH_AUDIT_SECRET": "readonly-check-audit-secret",
        "BLEEDWATCH_DATA_DIR": "/var/lib/bleedwatch",  # the image's; must not be needed
        "BLEEDWATCH_LOG_LEVEL": "info",  # "Application shutdown complete" is how a clean stop shows
    }
    try:
        out = subprocess.run(
            [unshare, "--mount", "sh", "-c", NAMESPACE, sys.executable, str(ROOT)],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    finally:
        _drop_prefix(prefix)
    if out.returncode != 0 and "mount" in out.stderr and "permission denied" in out.stderr.lower():
        pytest.skip(f"this machine does not allow mounts in a namespace: {out.stderr[-300:]}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["root_writable"] is False
    assert result["ingest"] == [202, False]  # queued by the API, processed by the worker
    assert result["findings"] == ["high"]
    assert result["api_metrics"] == result["worker_metrics"] == 200
    assert result["metric_files"], "the API's uvicorn workers wrote no metric files"
    assert result["errors"] == []
    assert set(result["exit_codes"]) <= {0, -15}, result["exit_codes"]
    assert result["shut_down"] == [True, True]
