"""Small things an attacker or a careless deploy would use: default passwords in compose, CSV
formulas, invisible characters in names, guessable audit digests, free-form meta."""

from __future__ import annotations

import hashlib
import hmac
import re
import stat
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from service import audit
from service.auth.keys import Role
from service.config import Settings
from service.incidents.impact import _cell
from service.ingest.schemas import Exchange
from service.wire import Name
from tests.conftest import Api
from tests.observability import ROOT
from tests.traffic import exchange, words

pytestmark = pytest.mark.anyio
SECRETS = ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "GRAFANA_ADMIN_PASSWORD", "BLEEDWATCH_AUDIT_SECRET")


def test_compose_has_no_default_passwords_and_redis_requires_one() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    for name in SECRETS:
        uses = re.findall(r"\$\{" + name + r"(:[?-])?[^}]*\}", text)
        assert uses, f"{name} is not used"
        assert set(uses) == {":?"}, f"{name}: every use must be ${{{name}:?...}} (no default, not empty)"
        assert re.search(rf"^{name}=$", (ROOT / ".env.example").read_text(), re.MULTILINE), name
    assert ":-bleedwatch}" not in text
    assert ":-admin}" not in text
    compose = yaml.safe_load(text)
    redis = compose["services"]["redis"]
    assert "--requirepass" in redis["command"]
    assert redis["environment"]["REDISCLI_AUTH"].startswith("${REDIS_PASSWORD:?")  # the healthcheck authenticates
    url = compose["x-bleedwatch-env"]["BLEEDWATCH_REDIS_URL"]
    assert url.startswith("redis://:${REDIS_PASSWORD:?")
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()


@pytest.mark.parametrize(
    "start", ["=", "+", "-", "@", "\t", "\r", "\n", " ", ";", "\uff1d", "\uff0b", "\uff0d", "\uff20"]
)
def test_csv_cells_that_could_start_a_formula_are_quoted(start: str) -> None:
    assert _cell(f"{start}cmd|' /C calc'!A0") == f"'{start}cmd|' /C calc'!A0"
    assert _cell(f" {start}SUM(A1)") == f"' {start}SUM(A1)"


def test_csv_cells_that_cannot_are_left_alone() -> None:
    for plain in ("acme", "Zürich", "42", "", "a=b", "x;y"):
        assert _cell(plain) == plain
    assert _cell(None) == ""


def test_every_format_character_is_refused_in_names() -> None:
    names = pydantic.TypeAdapter(Name)
    format_characters = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"]
    assert len(format_characters) > 150  # zero-width, bidi, BOM, tag characters...
    for char in [*format_characters, "\x85", "\x9f"]:  # and C1 controls
        with pytest.raises(pydantic.ValidationError):
            names.validate_python(f"ac{char}me")
    for fine in ("acme", "Zürich AG", "東京-01", "o'brien & co", "emoji 🙂"):
        assert names.validate_python(fine) == fine


def _exchange(**changes: Any) -> dict[str, Any]:
    return exchange("acme", "r-1", words("argparse"), words("json", 0, 30), time.time()) | changes


def test_names_in_an_exchange_refuse_invisible_characters() -> None:
    Exchange.model_validate(_exchange())
    for field, value in (
        ("tenant", "ac\u200bme"),  # zero-width space: looks like "acme"
        ("tenant", "\u202eemca"),  # right-to-left override: reads as "acme"
        ("model", "m-1m\ufeff"),
        ("request_id", "r\u2060-1"),
    ):
        with pytest.raises(pydantic.ValidationError) as refused:
            Exchange.model_validate(_exchange(**{field: value}))
        assert refused.value.errors()[0]["loc"] == (field,)


def test_meta_takes_its_listed_fields_only() -> None:
    listed = {"deployment": "pd-eu-1", "node": "decode-3", "prompt_tokens": 12, "end_user": "u-7"}
    assert Exchange.model_validate(_exchange(meta=listed)).meta.model_dump() == listed
    for extra in ({"comment": "the customer's whole prompt"}, {"user": "bob"}, {"prompt_tokens": 1, "x": 1}):
        with pytest.raises(pydantic.ValidationError) as refused:
            Exchange.model_validate(_exchange(meta=extra))
        assert refused.value.errors()[0]["type"] == "extra_forbidden"


async def test_meta_fields_and_key_names_are_refused_over_the_api(api: Api) -> None:
    body = {"exchanges": [_exchange(meta={"comment": "the customer's whole prompt"})]}
    resp = await api.client.post("/v1/exchanges", json=body, headers=api.headers(Role.INGEST))
    assert resp.status_code == 422
    assert "meta.comment" in resp.text
    assert "whole prompt" not in resp.text
    for name in ("gate\u200bway", "\u202eyawetag"):
        created = await api.client.post(
            "/v1/keys", json={"name": name, "role": "read"}, headers=api.headers(Role.ADMIN)
        )
        assert created.status_code == 422, name


def test_audit_digests_are_hmacs_under_the_server_secret(tmp_path: Path) -> None:
    audit.configure(Settings(audit_secret="s" * 32, data_dir=tmp_path))
    digest = audit.tenant_hash("acme")
    assert digest == "t:" + hmac.new(b"s" * 32, b"acme", hashlib.sha256).hexdigest()[:24]
    assert digest != "t:" + hashlib.sha256(b"acme").hexdigest()[:24]  # a name list alone cannot find it
    audit.configure(Settings(audit_secret="t" * 32, data_dir=tmp_path))
    assert audit.tenant_hash("acme") != digest

    # Unset: a random key in the data directory, private to its owner, the same on every start.
    audit.configure(Settings(data_dir=tmp_path / "a"))
    first = audit.tenant_hash("acme")
    key_file = tmp_path / "a" / audit.log.KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    audit.configure(Settings(data_dir=tmp_path / "a"))
    assert audit.tenant_hash("acme") == first
    audit.configure(Settings(data_dir=tmp_path / "b"))
    assert audit.tenant_hash("acme") != first
