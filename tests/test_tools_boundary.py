"""service/tools/ is tooling: only the command line reaches into it from the rest of service/."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICE = ROOT / "service"
TOOLS = SERVICE / "tools"
# The one module outside tools/ that may import it: the CLI dispatches `bleedwatch sim`, `demo`, ...
ENTRY_POINTS = {SERVICE / "cli.py"}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module an import statement in ``path`` names, relative imports resolved."""
    package = _module(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _is_tools(module: str) -> bool:
    return module == "service.tools" or module.startswith("service.tools.")


def test_nothing_outside_tools_imports_them() -> None:
    offenders = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in SERVICE.rglob("*.py")
        if TOOLS not in path.parents and path not in ENTRY_POINTS
        for module in _imports(path)
        if _is_tools(module)
    }
    assert not offenders, "service/tools/ is operator tooling, not the request path:\n" + "\n".join(sorted(offenders))


def test_the_walk_sees_an_import_of_tools() -> None:
    """The rule above is not vacuous: the walk does see imports of tools."""
    assert any(_is_tools(m) for m in _imports(SERVICE / "cli.py"))
    assert "service.tools.sim.engine" in _imports(TOOLS / "sim" / "reporter.py")


def test_the_api_loads_no_tools() -> None:
    code = "import sys, service.app; print(sorted(m for m in sys.modules if m.startswith('service.tools')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
