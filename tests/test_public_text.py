"""Public text out of the box: ``bleedwatch allowlist import-public`` and ``allowlist add``, run as operators do.

A small bundle laid out like ``licensedcode-data`` stands in for the 26 MB package; one test
imports the real one where it is installed.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from bleedwatch.exchange import fingerprint_exchange
from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS, Params, fingerprint_text, key_id
from service.allowlist import public, upload
from service.allowlist.packed import sorted_unique
from service.app import create_app
from service.auth.keys import Role
from service.cli import main
from service.config import Settings
from service.local_server import local_server
from service.migrate import upgrade
from tests.conftest import _create_keys
from tests.traffic import KEY, TEXTS, words

LICENSE = words("unittest")  # stands in for a license text
NOTICE = words("difflib", 0, 60)  # ... and for a license notice
EVERY = Params(w=1, sample_mod=1)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_bundle(root: Path) -> public.Bundle:
    """A LicenseDB tree with one of each kind of file the reader must keep or leave out."""
    data = root / "licensedcode" / "data"

    def file(path: str, meta: str, text: str) -> None:
        write(data / path, f"---\n{meta}\n---\n\n{text}\n")

    file("licenses/stand-in.LICENSE", "key: stand-in\nshort_name: Stand-in", LICENSE)
    file("rules/stand-in_1.RULE", "license_expression: stand-in\nis_license_notice: yes", NOTICE)
    file("rules/fp_1.RULE", "license_expression: x\nis_false_positive: yes", words("csv", 0, 40))
    file("rules/short.RULE", "license_expression: mit\nis_license_reference: yes", "MIT License")
    file("inactive/rules/old.RULE", "license_expression: y", words("socket", 0, 40))
    write(data / "README.rst", words("json"))
    return public.Bundle("0.test", data)


def expected_count(*texts: str, params: Params = EVERY) -> int:
    return len(sorted_unique([fingerprint_text(t, KEY, params).values for t in texts]))


def test_bundle_reader_selection(tmp_path: Path) -> None:
    texts = list(fake_bundle(tmp_path).texts())
    assert [t.name for t in texts] == ["licenses/stand-in.LICENSE", "rules/stand-in_1.RULE"]
    assert texts[0].text.split() == LICENSE.split()
    assert public.split_front_matter("no front matter") == ({}, "no front matter")
    meta, text = public.split_front_matter("---\nkey: 'mit'\nnotes: |\n  a: b\n---\nThe text.\n---\n")
    assert (meta, text) == ({"key": "mit", "notes": "|"}, "The text.\n---\n")


def test_a_file_read_in_blocks_gives_the_fingerprints_of_the_whole(tmp_path: Path) -> None:
    text = "\n".join(" ".join(words) for words in TEXTS.values())
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    pieces = list(upload.blocks(path, block_chars=700, overlap=80))
    assert len(pieces) > 20
    whole = np.unique(fingerprint_text(text, KEY, EVERY).values)
    assert np.array_equal(sorted_unique([fingerprint_text(p, KEY, EVERY).values for p in pieces]), whole)


@dataclass
class Service:
    url: str
    tokens: dict[Role, str]
    key_file: Path

    def call(self, method: str, path: str, role: Role = Role.ADMIN, **kwargs: Any) -> Any:
        resp = httpx.request(
            method, self.url + path, headers={"Authorization": f"Bearer {self.tokens[role]}"}, timeout=60, **kwargs
        )
        assert resp.status_code < 300, resp.text
        return resp.json()

    def cli(self, *args: str) -> int:
        return main([*args, "--url", self.url, "--api-key", self.tokens[Role.ADMIN], "--key-file", str(self.key_file)])

    def entries(self, label: str | None = None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.call("GET", "/v1/allowlist")["items"]
        return [e for e in items if label is None or e["label"] == label]


@contextmanager
def serving(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    """bleedwatch on a loopback port, as the CLI reaches it, with a key per role."""
    if settings.database_url is None:
        upgrade(settings)
    tokens = asyncio.run(_create_keys(settings))
    key_file = tmp_path / "key.hex"
    key_file.write_text(KEY.hex())
    with local_server(create_app(settings)) as url:
        yield Service(url, tokens, key_file)


@pytest.fixture
def service(settings: Settings, tmp_path: Path) -> Iterator[Service]:
    with serving(settings, tmp_path) as running:
        yield running


def test_import_public_is_idempotent_and_completes_a_cut_short_import(
    service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = fake_bundle(tmp_path)
    monkeypatch.setattr(public, "bundle", lambda: bundle)
    label = "public:scancode-licensedb:0.test"
    expected = expected_count(LICENSE, NOTICE)

    assert service.cli("allowlist", "import-public") == 0
    out = capsys.readouterr().out
    assert re.search(rf"allowlist entry \d+ \({label}\): added; 2 texts, {expected:,} distinct fingerprints", out)
    assert re.search(r"; \d+\.\d s$", out.strip())
    (entry,) = service.entries(label)
    assert (entry["key_id"], entry["fingerprint_count"]) == (key_id(KEY, DEFAULT_PARAMS), expected)

    assert service.cli("allowlist", "import-public") == 0
    assert "already imported, nothing sent" in capsys.readouterr().out
    assert [e["id"] for e in service.entries(label)] == [entry["id"]]

    service.call("DELETE", f"/v1/allowlist/{entry['id']}")  # an import cut short after its first request
    values = fingerprint_text(LICENSE, KEY, EVERY).values[:10]
    body = {"key_id": key_id(KEY, DEFAULT_PARAMS), "label": label, "fingerprints": values.tolist()}
    partial = service.call("POST", "/v1/allowlist", json=body)
    assert service.cli("allowlist", "import-public") == 0
    assert f"allowlist entry {partial['id']} ({label}): added" in capsys.readouterr().out
    active = [e for e in service.entries(label) if e["revoked_at"] is None]
    assert [(e["id"], e["fingerprint_count"]) for e in active] == [(partial["id"], expected)]

    assert service.cli("allowlist", "import-public", "--w", "1") == 0  # gateways sending every shingle
    capsys.readouterr()
    assert {e["key_id"] for e in service.entries(label) if e["revoked_at"] is None} == {
        key_id(KEY, DEFAULT_PARAMS),
        key_id(KEY, Params(w=1)),
    }


def test_import_public_without_the_bundle_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    key_file = tmp_path / "key.hex"
    key_file.write_text(KEY.hex())
    args = ["allowlist", "import-public", "--api-key", "bw_a_b", "--key-file", str(key_file)]
    assert main([*args, "--url", "http://127.0.0.1:9"]) == 2
    assert "pip install 'licensedcode-data>=32'" in capsys.readouterr().err


def test_import_public_with_a_wrong_key_fails_before_fingerprinting_the_bundle(
    service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    read: list[str] = []

    class Watched(public.Bundle):
        def texts(self, min_tokens: int = public.MIN_TOKENS) -> Iterator[public.PublicText]:
            read.append(self.label)
            yield from super().texts(min_tokens)

    watched = Watched("0.test", fake_bundle(tmp_path).root)
    monkeypatch.setattr(public, "bundle", lambda: watched)
    args = ["allowlist", "import-public", "--url", service.url, "--key-file", str(service.key_file)]
    assert main([*args, "--api-key", service.tokens[Role.READ]]) == 1
    assert "403 forbidden" in capsys.readouterr().err
    assert read == []  # the real bundle takes half a minute to fingerprint: the key is checked first


def test_allowlist_add_takes_files_and_directories_in_chunks(
    service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(upload, "REQUEST_FINGERPRINTS", 100)
    docs = tmp_path / "docs"
    kept = [words("argparse"), words("subprocess") + "\n" + words("argparse", 0, 50), words("sqlite3")]
    write(docs / "guide" / "a.md", kept[0])
    write(docs / "guide" / "b.txt", kept[1])
    write(docs / ".cache" / "c.txt", words("socket"))  # hidden: skipped
    write(docs / ".d.txt", words("socket"))
    (docs / "logo.png").write_bytes(b"\x89PNG\r\n\x00\x00" + words("socket").encode())  # binary: skipped
    write(tmp_path / "notes.txt", kept[2])
    assert service.cli("allowlist", "add", str(docs), str(tmp_path / "notes.txt")) == 0
    expected = expected_count(*kept)
    assert f"added; 3 texts, {expected:,} distinct fingerprints, {expected:,} in the entry" in capsys.readouterr().out
    (entry,) = service.entries()
    assert (entry["label"], entry["key_id"], entry["fingerprint_count"]) == (
        "docs and 1 more",
        key_id(KEY, DEFAULT_PARAMS),
        expected,
    )
    audit = service.call("GET", "/v1/audit", params={"target": f"allowlist:{entry['id']}", "limit": 100})["items"]
    actions = [e["action"] for e in audit]
    assert actions[-1] == "allowlist.add"
    assert actions.count("allowlist.append") == -(-expected // 100) - 1
    # Counts of one in the singular: a text too short for a fingerprint, and one with a single one.
    write(tmp_path / "one" / "short.txt", "too short")
    assert service.cli("allowlist", "add", str(tmp_path / "one" / "short.txt")) == 0
    assert capsys.readouterr().out.startswith("nothing to allowlist: 1 text gave no fingerprints (")
    write(tmp_path / "one" / "line.txt", "too short to fingerprint")
    assert service.cli("allowlist", "add", str(tmp_path / "one" / "line.txt")) == 0
    assert "added; 1 text, 1 distinct fingerprint, 1 in the entry" in capsys.readouterr().out


def post(service: Service, exchange: dict[str, Any]) -> None:
    service.call("POST", "/v1/exchanges", Role.INGEST, json={"exchanges": [exchange]})


def quote(service: Service, license_text: str, w: int) -> list[dict[str, Any]]:
    """Tenant a sends a license in a prompt; tenant b's answer quotes 70 words of it. The findings."""
    now, params = time.time(), Params(w=w)
    prompt = license_text + "\n\nDoes this allow commercial use?"
    source = fingerprint_exchange(
        prompt, words("json", 0, 40), key=KEY, tenant="a", request_id="a1", model="m", ts=now, params=params
    )
    answer = "Yes. The license says: " + " ".join(license_text.split()[20:90]) + " So it does."
    recipient = fingerprint_exchange(
        words("heapq"), answer, key=KEY, tenant="b", request_id="b1", model="m", ts=now, params=params
    )
    post(service, source)
    post(service, recipient)
    items: list[dict[str, Any]] = service.call("GET", "/v1/findings", Role.READ)["items"]
    return items


@pytest.mark.parametrize("w", [5, 1])
@pytest.mark.parametrize("imported", [True, False])
def test_a_quoted_license_is_a_finding_only_without_import_public(
    service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, imported: bool, w: int
) -> None:
    bundle = fake_bundle(tmp_path)
    monkeypatch.setattr(public, "bundle", lambda: bundle)
    if imported:
        assert service.cli("allowlist", "import-public", "--w", str(w)) == 0
    found = quote(service, LICENSE, w)
    if imported:
        assert found == []
    else:
        assert [(f["recipient_tenant"], f["source_tenant"]) for f in found] == [("b", "a")]


def _real_bundle() -> public.Bundle:
    try:
        return public.bundle()
    except public.BundleMissing:
        pytest.skip(f"licensedcode-data is not installed; to run this test: {public.INSTALL_HINT}")


@pytest.mark.parametrize("settings", ["redis+postgres"], indirect=True)
def test_the_real_licensedb_imports_once_and_silences_a_quoted_mit_license(
    service: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _real_bundle()
    assert service.cli("allowlist", "import-public") == 0
    out = capsys.readouterr().out
    with capsys.disabled():
        print(out)  # the bundle's size and the import's time, shown past the capture
    match = re.search(r"added; ([\d,]+) texts, ([\d,]+) distinct fingerprints", out)
    assert match, out
    texts, fingerprints = (int(g.replace(",", "")) for g in match.groups())
    assert texts > 10_000
    assert fingerprints > 500_000
    assert service.cli("allowlist", "import-public") == 0
    assert "already imported, nothing sent" in capsys.readouterr().out
    _, mit = public.split_front_matter((bundle.root / "licenses" / "mit.LICENSE").read_text())
    assert quote(service, mit, DEFAULT_PARAMS.w) == []
