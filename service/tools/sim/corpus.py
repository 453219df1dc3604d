"""Tenants' prompts, from text that ships with Python: standard-library docstrings, never our prose.

Every tenant owns the docstrings of its own modules (a module, its public classes, their
methods and its public functions, each docstring given to one tenant only), so two tenants'
texts never share a passage and any of one tenant's words in another's answer is a leak.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from functools import lru_cache

TENANT_MODULES: dict[str, tuple[str, ...]] = {
    "acme": ("logging", "argparse", "json", "csv"),
    "globex": ("socket", "ssl", "smtplib"),
    "initech": ("doctest", "difflib"),
    "umbrella": ("pdb", "inspect"),
    "hooli": ("statistics", "decimal", "email.message"),
    "vandelay": ("configparser", "codecs", "threading", "shutil"),
}
TENANTS = tuple(TENANT_MODULES)


def _docstrings(module_name: str, seen: set[str]) -> list[str]:
    module = importlib.import_module(module_name)
    own = {module_name, module_name.rsplit(".", 1)[-1], "_" + module_name.rsplit(".", 1)[-1]}
    out: list[str] = []

    def take(obj: object) -> None:
        doc = getattr(obj, "__doc__", None)
        if isinstance(doc, str) and doc.strip() and doc not in seen:
            seen.add(doc)
            out.append(doc)

    take(module)
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if getattr(obj, "__module__", None) not in own:
            continue  # re-exported from elsewhere: another module's text
        take(obj)
        if inspect.isclass(obj):
            for member_name, member in sorted(vars(obj).items()):
                if not member_name.startswith("_") and inspect.isroutine(member):
                    take(member)
    return out


@lru_cache(maxsize=1)
def _corpus() -> dict[str, tuple[str, ...]]:
    seen: set[str] = set()
    out: dict[str, tuple[str, ...]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # importing some modules warns; their text is what we want
        for tenant, modules in TENANT_MODULES.items():
            words: list[str] = []
            for name in modules:
                for doc in _docstrings(name, seen):
                    words.extend(doc.split())
            out[tenant] = tuple(words)
    return out


def tenant_words(tenant: str) -> tuple[str, ...]:
    """All of a tenant's text, as words (the simulator's tokens)."""
    return _corpus()[tenant]


def prompt(tenant: str, words: int, start: int = 0) -> str:
    """``words`` consecutive words of the tenant's text from ``start``, wrapping around."""
    text = tenant_words(tenant)
    if words > len(text):
        raise ValueError(f"{tenant} has {len(text)} words of text, fewer than {words}")
    start %= len(text)
    return " ".join((text + text)[start : start + words])
