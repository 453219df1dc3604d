"""Real text for benchmarks and evaluation: docstrings of the Python standard library.

Nothing here is written by us; it is what ships with the interpreter, so any machine that runs
bleedwatch can rebuild the same corpus.
"""

from __future__ import annotations

import importlib
import pkgutil
import random
import warnings


def docstrings(min_words: int = 40) -> list[list[str]]:
    """Word lists of every stdlib module, class and function docstring with at least ``min_words``."""
    out: list[list[str]] = []
    seen: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for info in sorted(pkgutil.iter_modules(), key=lambda m: m.name):
            if info.name.startswith("_") or info.name in {"antigravity", "this", "idlelib", "tkinter", "turtle"}:
                continue
            try:
                module = importlib.import_module(info.name)
            except Exception:  # noqa: S112 - optional modules missing on this platform
                continue
            for obj in [module, *vars(module).values()]:
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
