"""A small multi-tenant traffic sample with one leak, built from text that ships with Python.

Four tenants share a system prompt (boilerplate, must not be flagged); initech's answer
quotes its own prompt (self-echo, must not be flagged); globex's answer carries 40 words of
acme's prompt (the leak), and it reaches bleedwatch *before* acme's prompt does.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import difflib
import heapq
import http.client
import io
import json
import socket
import sqlite3
import subprocess
import unittest
from typing import Any

LEAK_WORDS = 40


def _words(doc: str | None) -> list[str]:
    return (doc or "").split()


def _zen() -> str:
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # prints the Zen of Python on first import
    return "".join(this.d.get(c, c) for c in this.s)


def sample(base_ts: float) -> list[dict[str, Any]]:
    system = _zen()
    acme_prompt = " ".join(_words(argparse.__doc__) + _words(json.__doc__))
    leaked = " ".join(_words(argparse.__doc__)[60 : 60 + LEAK_WORDS])
    globex_answer = " ".join(_words(csv.__doc__)[:120]) + " " + leaked + " " + " ".join(_words(heapq.__doc__)[:80])
    initech_prompt = " ".join(_words(socket.__doc__))
    initech_answer = (
        "As your text says: "
        + " ".join(_words(socket.__doc__)[40:100])
        + " "
        + " ".join(_words(unittest.__doc__)[150:210])
    )
    node = {"deployment": "pd-disagg-eu-1", "node": "decode-07"}

    def exchange(i: int, tenant: str, prompt: str, response: str, **meta: Any) -> dict[str, Any]:
        return {
            "ts": base_ts + i,
            "tenant": tenant,
            "request_id": f"{tenant}-{i:04d}",
            "model": "open-weights-1m",
            "prompt": system + "\n\n" + prompt,
            "response": response,
            "meta": node | meta,
        }

    return [
        exchange(1, "globex", " ".join(_words(sqlite3.__doc__)), globex_answer),
        exchange(2, "umbrella", " ".join(_words(http.client.__doc__)), " ".join(_words(unittest.__doc__)[:150])),
        exchange(3, "initech", initech_prompt, initech_answer),
        exchange(4, "acme", acme_prompt, " ".join(_words(subprocess.__doc__)[:120])),
        exchange(5, "umbrella", " ".join(_words(difflib.__doc__)), " ".join(_words(heapq.__doc__)[80:200])),
    ]
