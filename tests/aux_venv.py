"""Virtualenvs apart from the suite's own, for tests that must not see the server's packages
(the SDK wheel alone) or that need a heavy one the suite does not depend on (LiteLLM).

Each lives under ``<cache>/<name>-<hash>``, the hash of its requirements, of the files that
define them and of the interpreter's version, so a changed requirement gets a fresh one. A venv
that tests only read (LiteLLM's) is kept in ``~/.cache/bleedwatch/test-venvs``
(``$BLEEDWATCH_TEST_VENVS`` moves it), so every checkout on a machine installs it once: CI
clones afresh for each run. One a test installs into (the SDK wheel's) stays in the checkout's
``.cache/venvs``, so two checkouts never change each other's. A venv is marked complete only after its install
succeeded; a half-made one (a killed run) is removed and made again. Concurrent runs take an
flock.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "venvs"
SHARED_CACHE = Path(
    os.environ.get("BLEEDWATCH_TEST_VENVS")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bleedwatch" / "test-venvs"
)
SDK = ROOT / "sdk"


class NotInstallable(Exception):
    """pip could not install the requirements (no index reachable, no wheel for this Python)."""


def python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def site_packages(venv_dir: Path) -> Path:
    out = subprocess.run(
        [python(venv_dir), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def cached_venv(name: str, requirements: Sequence[str], key_files: Sequence[Path] = (), *, cache: Path = CACHE) -> Path:
    """A venv with ``requirements`` installed, made once per distinct requirements."""
    digest = hashlib.sha256(f"{sys.version}\n{name}\n".encode() + "\n".join(requirements).encode())
    for f in key_files:
        digest.update(f.read_bytes())
    path = cache / f"{name}-{digest.hexdigest()[:12]}"
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / ".complete").exists():
            return path
        shutil.rmtree(path, ignore_errors=True)
        if cache == CACHE:  # earlier requirements of this checkout: nothing uses them any more
            for old in cache.glob(f"{name}-*"):
                shutil.rmtree(old, ignore_errors=True)
        venv.create(path, with_pip=True, clear=True)
        if requirements:
            done = subprocess.run(
                [python(path), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if done.returncode != 0:
                shutil.rmtree(path, ignore_errors=True)
                tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-3:])
                raise NotInstallable(f"pip install {' '.join(requirements)} failed: {tail}")
        (path / ".complete").touch()
        return path


def sdk_requirements() -> list[str]:
    """The SDK's own dependencies, read from its pyproject (so the venv follows it)."""
    import tomllib

    project = tomllib.loads((SDK / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


def build_sdk_wheel(out: Path) -> Path:
    """The SDK's wheel, built from sdk/ without build isolation (hatchling is a dev dependency,
    so no index is needed at test time)."""
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "-w", str(out), str(SDK)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("bleedwatch_sdk-*.whl")
    return wheel


def dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6


# Run by a venv's own interpreter: the installed size of one distribution and everything it
# requires (extras followed where a requirement names them), from the files each one's RECORD lists.
CLOSURE_SCRIPT = r"""
import importlib.metadata as md, re, sys
def norm(n): return re.sub(r"[-_.]+", "-", n).lower()
counted, followed, total, stack = set(), set(), 0, [(sys.argv[1], frozenset())]
while stack:
    name, extras = stack.pop()
    if (norm(name), extras) in followed:
        continue
    followed.add((norm(name), extras))
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    if norm(name) not in counted:
        counted.add(norm(name))
        total += sum(p.stat().st_size for f in dist.files or [] if (p := f.locate()).is_file())
    for req in dist.requires or []:
        m = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", req)
        want = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", req)
        if want and want.group(1) not in extras:
            continue
        stack.append((m.group(1), frozenset(e.strip() for e in (m.group(2) or "").split(",") if e.strip())))
print(round(total / 1e6, 1), len(counted))
"""


def closure_mb(interpreter: Path | str, distribution: str) -> tuple[float, int]:
    """Installed MB of ``distribution`` with its dependencies, in the venv of ``interpreter``,
    and how many distributions that is. An editable install counts only its link files."""
    out = subprocess.run(
        [str(interpreter), "-I", "-c", CLOSURE_SCRIPT, distribution], check=True, capture_output=True, text=True
    )
    mb, count = out.stdout.split()
    return float(mb), int(count)
