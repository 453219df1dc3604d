"""What importing the SDK costs: no scan of every code point, and a fingerprinting process that
loads the scheme and not the client.

``bleedwatch.names`` builds its patterns (the format characters: a scan of all 1.1M code points, a
quarter of a second) on first use only, and the SDK checks names with ``names.forbidden``, which
gives the patterns' answer without them. ``python -m bleedwatch.worker`` loads neither the client
nor httpx or asyncio: the package's names are loaded on first use. Each check runs in a fresh
interpreter, as a gateway or the worker process starts, since this one has the service loaded.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import bleedwatch
from bleedwatch import names
from bleedwatch.exchange import name_problem

PUBLIC = [
    "BleedwatchClient",
    "Fingerprints",
    "Params",
    "Rejected",
    "Spool",
    "Undelivered",
    "fingerprint_exchange",
    "fingerprint_text",
    "key_id",
]


def fresh(code: str) -> dict[str, object]:
    """Run ``code`` in a new interpreter the way the client starts its worker (``-P``, the path through
    PYTHONPATH); it prints one JSON object."""
    done = subprocess.run(
        [sys.executable, "-P", "-c", code],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_forbidden_answers_as_the_name_patterns_do_on_every_code_point() -> None:
    name, optional = re.compile(names.NAME_PATTERN), re.compile(names.OPTIONAL_NAME_PATTERN)
    chars = [chr(code) for code in range(sys.maxunicode + 1)]
    refused = {c for c, allowed in zip(chars, map(name.fullmatch, chars), strict=True) if allowed is None}
    assert refused == {c for c in chars if names.forbidden(c)}
    assert {c for c in chars if optional.fullmatch(c) is None} == refused
    assert len(refused) > 150 + 65  # format characters, C0 and C1 controls, U+2028, U+2029
    for text in ("acme", "Zürich AG", "東京-01", "emoji 🙂", "ac\u200bme", "a\nb", "\u202eevil", "x\U000e0041"):
        assert names.forbidden(text) == (name.fullmatch(text) is None), ascii(text)
    assert not names.forbidden("")  # the empty name is refused by length (name_problem), as NAME_PATTERN's "+"


def test_the_client_checks_names_without_building_the_patterns() -> None:
    """A gateway's import and its name checks never scan every code point; the service's schemas,
    which need the patterns, still get them, the same strings as ever."""
    got = fresh(
        "import json, sys\n"
        "from bleedwatch import BleedwatchClient\n"
        "import bleedwatch.limits, bleedwatch.names\n"
        "from bleedwatch.exchange import name_problem\n"
        "ok = {'tenant': 'acme', 'request_id': 'r-1', 'model': 'm', 'meta': {'node': 'n\u00e9'}}\n"
        "bad = [{'tenant': 'ac\\u200bme'}, {'model': ''}, {'meta': {'node': 'a\\u2028b'}}]\n"
        "problems = [name_problem(ok), *(name_problem(ok | b) for b in bad)]\n"
        "built = sorted(vars(bleedwatch.names).keys() & {'FORMAT_CHARACTERS', 'NAME_PATTERN'})\n"
        "print(json.dumps({'problems': problems, 'built': built, 'pattern': bleedwatch.limits.NAME_PATTERN}))\n"
    )
    assert got["problems"] == [None, "invalid:tenant", "invalid:model", "invalid:meta"]
    assert got["built"] == []
    assert got["pattern"] == names.NAME_PATTERN  # built when asked for, as the service asks


def test_the_fingerprinting_process_loads_the_scheme_and_not_the_client() -> None:
    got = fresh(
        "import json, sys\n"
        "import bleedwatch.worker\n"
        "print(json.dumps({'modules': sorted(sys.modules),\n"
        "                  'built': 'NAME_PATTERN' in vars(sys.modules['bleedwatch.names'])}))\n"
    )
    modules = set(got["modules"])  # type: ignore[call-overload]
    assert {"bleedwatch.exchange", "bleedwatch.fingerprint.scheme", "numpy", "orjson"} <= modules
    assert not modules & {"bleedwatch.client", "bleedwatch.hashing", "bleedwatch.spool", "httpx", "asyncio"}
    assert got["built"] is False


def test_the_package_names_are_all_there() -> None:
    assert sorted(bleedwatch.__all__) == sorted(PUBLIC)
    star: dict[str, object] = {}
    exec("from bleedwatch import *", star)  # noqa: S102
    assert set(PUBLIC) <= star.keys()
    for public in PUBLIC:
        value = getattr(bleedwatch, public)
        assert value is getattr(sys.modules[value.__module__], public)
        assert public in dir(bleedwatch)
    with pytest.raises(AttributeError, match="no attribute 'Client'"):
        bleedwatch.Client  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ImportError):
        from bleedwatch import NotThere  # type: ignore[attr-defined]  # noqa: F401
    assert name_problem({"tenant": "a", "request_id": "r", "model": "m"}) is None
