"""Test traffic from real text that ships with Python: module docstrings, never hand-written prose."""

from __future__ import annotations

import argparse
import csv
import difflib
import heapq
import http.client
import json
import socket
import sqlite3
import subprocess
import unittest
from typing import Any

from bleedwatch.exchange import fingerprint_exchange
from bleedwatch.fingerprint.scheme import Fingerprints, Params, fingerprint_text

KEY = bytes(range(32))
TEXTS = {
    name: (mod.__doc__ or "").split()
    for name, mod in {
        "argparse": argparse,
        "csv": csv,
        "difflib": difflib,
        "heapq": heapq,
        "http": http.client,
        "json": json,
        "socket": socket,
        "sqlite3": sqlite3,
        "subprocess": subprocess,
        "unittest": unittest,
    }.items()
}
BOILERPLATE = " ".join(TEXTS["unittest"][:80])


def words(name: str, start: int = 0, stop: int | None = None) -> str:
    return " ".join(TEXTS[name][start:stop])


UNSAMPLED = Params(sample_mod=1)


def fp(text: str, params: Params = UNSAMPLED) -> Fingerprints:
    return fingerprint_text(text, KEY, params)


def exchange(tenant: str, request_id: str, prompt: str, response: str, ts: float, **meta: Any) -> dict[str, Any]:
    return fingerprint_exchange(
        prompt,
        response,
        key=KEY,
        tenant=tenant,
        request_id=request_id,
        model="m-1m",
        ts=ts,
        meta={"deployment": "pd-eu-1", "node": "decode-3"} | meta,
    )


def totals(result: dict[str, Any]) -> dict[str, Any]:
    """An ingest answer's totals, without its per-exchange ``results`` (and ``rejected`` when 0)."""
    return {k: v for k, v in result.items() if k != "results" and not (k == "rejected" and v == 0)}
