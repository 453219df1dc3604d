"""Install size of bleedwatch-sdk against the server's: each wheel installed with its
dependencies into a fresh venv, and the venv's site-packages measured, pip and setuptools left out.

    .venv/bin/python bench/install_size.py

Needs the package index (or pip's cache) for the dependencies. tests/test_sdk_wheel.py prints
the SDK's figure on every CI run from its cached venv.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import venv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.aux_venv import ROOT, SDK, closure_mb, python, site_packages

TOOLING = ("pip", "setuptools", "_distutils_hack", "distutils-precedence.pth")


def measured(venv_dir: Path) -> float:
    """MB under site-packages, without the installer's own packages and their dist-info."""
    total = 0
    for entry in site_packages(venv_dir).iterdir():
        if entry.name.startswith(TOOLING):
            continue
        files = [entry] if entry.is_file() else [f for f in entry.rglob("*") if f.is_file()]
        total += sum(f.stat().st_size for f in files)
    return total / 1e6


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        wheels = Path(tmp) / "wheels"
        pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        subprocess.run([*pip_wheel, "-w", str(wheels), str(SDK), str(ROOT)], check=True)
        (sdk_wheel,) = wheels.glob("bleedwatch_sdk-*.whl")
        (server_wheel,) = wheels.glob("bleedwatch_server-*.whl")
        rows = []
        for name, dist, wheel_files in (
            ("bleedwatch-sdk", "bleedwatch-sdk", [sdk_wheel]),
            ("server (bleedwatch-server, no extras)", "bleedwatch-server", [server_wheel, sdk_wheel]),
        ):
            env = Path(tmp) / dist
            venv.create(env, with_pip=True)
            subprocess.run([python(env), "-m", "pip", "install", "--quiet", *map(str, wheel_files)], check=True)
            _, count = closure_mb(python(env), dist)
            rows.append((name, measured(env), count))
    print("| install | site-packages (MB) | distributions |")
    print("|---|---|---|")
    for name, mb, count in rows:
        print(f"| {name} | {mb:.1f} | {count} |")


if __name__ == "__main__":
    main()
