"""The import graph of ``service/`` has no cycles (issue 22).

A cycle means two modules cannot be read, tested or moved apart, and it hides in imports made
inside functions to dodge the circular-import error, so every import counts here, wherever it
sits. An AST walk needs no dependency and imports nothing. ``python tests/test_import_graph.py``
prints the numbers the issue tracks: module cycles, and the package knot (the largest group of
packages that all reach one another).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "service"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of ``service/`` and the ``service`` modules it imports, anywhere in its body
    (under ``if TYPE_CHECKING:`` too: mypy needs that edge, and such a cycle is one a refactor trips on)."""
    files = {_module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                # "from service.x import y": y may be a module or a name in service.x; take the longest known.
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name and target != PACKAGE:
                    graph[name].add(target)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components in no particular order, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(sorted(component))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each knot of modules that import one another, as one path around it (first module repeated)."""
    found = []
    for component in strongly_connected(graph):
        if len(component) < 2:
            continue
        members = set(component)
        path = [component[0]]
        while True:  # walk inside the component until a module repeats
            nxt = min(graph[path[-1]] & members)
            if nxt in path:
                found.append([*path[path.index(nxt) :], nxt])
                break
            path.append(nxt)
    return found


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Modules folded into their package under ``service`` (``service.app`` stays itself)."""

    def package(name: str) -> str:
        return ".".join(name.split(".")[:2])

    out: dict[str, set[str]] = {}
    for name, targets in graph.items():
        out.setdefault(package(name), set()).update(package(t) for t in targets if package(t) != package(name))
    return out


def package_knot(graph: dict[str, set[str]]) -> list[str]:
    return max(strongly_connected(package_graph(graph)), key=len)


def test_no_import_cycles() -> None:
    found = cycles(module_graph())
    assert not found, "import cycles in service/: " + "; ".join(" -> ".join(c) for c in found)


if __name__ == "__main__":  # python tests/test_import_graph.py [another checkout's root, to compare]
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT
    g = module_graph(root)
    found = cycles(g)
    knot = package_knot(g)
    packages = [n for n in knot if (root / n.replace(".", "/")).is_dir()]
    print(f"modules: {len(g)}; module cycles: {len(found)}")
    for c in found:
        print("  " + " -> ".join(c))
    print(f"package knot: {len(knot)} nodes, {len(packages)} of them packages")
    print("  " + ", ".join(n.removeprefix(PACKAGE + ".") for n in knot))
