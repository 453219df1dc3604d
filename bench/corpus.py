"""Real text for benchmarks and evaluation: docstrings of the Python standard library.

Nothing here is written by us; it is what ships with the interpreter, so any machine that runs
bleedwatch can rebuild the same corpus.
"""

from __future__ import annotations

import importlib
import random
import sys
import types
import warnings


def docstrings(min_words: int = 40) -> list[list[str]]:
    """Word lists of every stdlib module, class and function docstring with at least ``min_words``.

    Only the standard library (``sys.stdlib_module_names``), so the corpus is the same on every
    machine with the same Python, whatever else is installed or on the path. Submodules found
    as a package's attributes are skipped: which of them are there depends on what the process
    imported before (the evaluation's traffic must not change with its imports).
    """
    out: list[list[str]] = []
    seen: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sorted(sys.stdlib_module_names):
            if name.startswith("_") or name in {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo"}:
                continue
            try:
                module = importlib.import_module(name)
            except Exception:  # noqa: S112 - optional modules missing on this platform
                continue
            for obj in [module, *(v for v in vars(module).values() if not isinstance(v, types.ModuleType))]:
                doc = getattr(obj, "__doc__", None)
                if isinstance(doc, str) and doc not in seen:
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
