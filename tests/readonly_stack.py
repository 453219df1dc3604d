"""Runs what a Kubernetes pod of deploy/kubernetes/ runs, from inside a mount namespace whose root
is read-only and whose /tmp and /tmp/bleedwatch-metrics are fresh tmpfs (the pods' emptyDirs):
``bleedwatch migrate``, ``keys create``, ``serve`` (two uvicorn workers, ``BLEEDWATCH_INGEST_WORKERS=0``)
and ``work``; then one leak through the API, processed by the worker. Prints one JSON line.
tests/test_readonly_root.py starts it; settings come from the environment, as in a pod."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from service.local_server import free_port
from tests.traffic import BOILERPLATE, exchange, words

BLEEDWATCH = str(Path(sys.executable).parent / "bleedwatch")


def _key(role: str) -> str:
    out = subprocess.run(
        [BLEEDWATCH, "keys", "create", "--name", f"readonly-{role}", "--role", role],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return next(word for word in (out.stdout + out.stderr).split() if word.startswith("bw_"))


def _wait_ready(url: str, procs: list[subprocess.Popen[str]], deadline: float) -> None:
    while True:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args!r} exited: {proc.communicate()[0][-3000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} not ready")
        time.sleep(0.2)


def main() -> int:
    result: dict[str, Any] = {"root_writable": os.access("/", os.W_OK) and _writable("/readonly-check")}
    subprocess.run([BLEEDWATCH, "migrate"], check=True, timeout=120)
    ingest, reader = _key("ingest"), _key("read")
    api_port, work_port = free_port(), free_port()
    env = os.environ | {"BLEEDWATCH_HOST": "127.0.0.1"}
    serve = subprocess.Popen(
        [BLEEDWATCH, "serve"],
        env=env
        | {
            "BLEEDWATCH_PORT": str(api_port),
            "BLEEDWATCH_WORKERS": "2",
            "BLEEDWATCH_INGEST_WORKERS": "0",
            "PROMETHEUS_MULTIPROC_DIR": "/tmp/bleedwatch-metrics",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    work = subprocess.Popen(
        [BLEEDWATCH, "work"],
        env=env | {"BLEEDWATCH_WORK_PORT": str(work_port), "BLEEDWATCH_INGEST_WORKERS": "2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    api, worker = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{work_port}"
    try:
        deadline = time.monotonic() + 60
        _wait_ready(api, [serve, work], deadline)
        _wait_ready(worker, [serve, work], deadline)
        now = time.time()
        leaked = words("csv", 0, 100) + " " + words("argparse", 60, 100) + " " + words("heapq", 0, 60)
        batch = {
            "exchanges": [
                exchange("tenant-a", "ro-a", BOILERPLATE + " " + words("argparse"), words("json", 0, 120), now),
                exchange("tenant-b", "ro-b", BOILERPLATE + " " + words("sqlite3"), leaked, now + 1),
            ]
        }
        answer = httpx.post(
            f"{api}/v1/exchanges",
            json=batch,
            headers={"Authorization": f"Bearer {ingest}", "Prefer": "respond-async"},
            timeout=30,
        )
        result["ingest"] = [answer.status_code, answer.json().get("processed")]
        read = {"Authorization": f"Bearer {reader}"}
        while time.monotonic() < deadline:
            findings = httpx.get(f"{api}/v1/findings", headers=read, timeout=10).json()["items"]
            if findings:
                break
            time.sleep(0.2)
        result["findings"] = [f["severity"] for f in findings]
        result["api_metrics"] = httpx.get(f"{api}/metrics", timeout=10).status_code
        result["worker_metrics"] = httpx.get(f"{worker}/metrics", timeout=10).status_code
        result["metric_files"] = sorted(p.name.split("_")[0] for p in Path("/tmp/bleedwatch-metrics").glob("*.db"))[:1]
    finally:
        for proc in (serve, work):
            proc.terminate()
        logs = [proc.communicate(timeout=60)[0] for proc in (serve, work)]
    # uvicorn re-raises the SIGTERM it handled once shut down: -15 after a clean shutdown is expected.
    result["exit_codes"] = [serve.returncode, work.returncode]
    result["shut_down"] = ["Application shutdown complete" in log for log in logs]
    result["errors"] = [
        line for log in logs for line in log.splitlines() if "Traceback" in line or '"level":"error"' in line
    ]
    print(json.dumps(result))
    return 0


def _writable(path: str) -> bool:
    try:
        Path(path).touch()
    except OSError:
        return False
    Path(path).unlink()
    return True


if __name__ == "__main__":
    sys.exit(main())
