"""Real text for benchmarks and evaluation: docstrings of the Python standard library.

Nothing here is written by us; it is what ships with the interpreter, so any machine that runs
bleedwatch can rebuild the same corpus.
"""

from __future__ import annotations

import ast
import importlib.util
import random
import sys
import tokenize
import warnings


def docstrings(min_words: int = 40) -> list[list[str]]:
    """Word lists of every stdlib module, class, function and method docstring with at least ``min_words``.

    Only the standard library (``sys.stdlib_module_names``), so the corpus is the same on every
    machine with the same Python, whatever else is installed or on the path. Read from the
    modules' source files, never imported: what an imported module exposes depends on what the
    process imported before, and the evaluation's traffic must not change with its imports.
    """
    out: list[list[str]] = []
    seen: set[str] = set()
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo"}:
            continue
        spec = importlib.util.find_spec(name)  # a top-level name: found, not run
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue  # built into the interpreter, or missing on this platform
        with tokenize.open(spec.origin) as source, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences in old modules
            tree = ast.parse(source.read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            doc = ast.get_docstring(node, clean=False)
            if doc is not None and doc not in seen:
                seen.add(doc)
                words = doc.split()
                if len(words) >= min_words:
                    out.append(words)
    return out


def text(rng: random.Random, corpus: list[list[str]], words: int) -> str:
    """``words`` words of consecutive docstrings, starting at a random one."""
    out: list[str] = []
    i = rng.randrange(len(corpus))
    while len(out) < words:
        out.extend(corpus[i % len(corpus)])
        i += 1
    return " ".join(out[:words])
