"""Models and migrations never drift, on both databases; migrations also go down cleanly."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import orjson
import psycopg
import pytest
from alembic import command
from sqlalchemy import create_engine, inspect, text

from service.config import Settings
from service.migrate import alembic_config, upgrade
from tests.conftest import DATABASE_URL, RUN_ID, _with_schema


def test_models_match_migrations_on_sqlite(tmp_path: Path) -> None:
    settings = Settings(database_url=None, data_dir=tmp_path)
    upgrade(settings)
    command.check(alembic_config(settings))


def test_models_match_migrations_on_postgres(pg_url: str) -> None:
    command.check(alembic_config(Settings(database_url=pg_url)))


def test_downgrade_to_base_and_up_again(tmp_path: Path) -> None:
    settings = Settings(database_url=None, data_dir=tmp_path)
    cfg = alembic_config(settings)
    upgrade(settings)
    command.downgrade(cfg, "base")
    engine = create_engine(settings.sqlalchemy_url(asynchronous=False))
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    upgrade(settings)
    assert {"findings", "api_keys"} <= set(inspect(engine).get_table_names())
    engine.dispose()


def test_unknown_database_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="postgresql:// or sqlite://"):
        Settings(database_url="mysql://x/y").sqlalchemy_url(asynchronous=True)


@contextmanager
def _pg_schema(name: str) -> Iterator[str]:
    schema = f"bw_test_{RUN_ID}_{name}"
    with psycopg.connect(DATABASE_URL, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield _with_schema(DATABASE_URL, schema)
    finally:
        with psycopg.connect(DATABASE_URL, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", "postgres"])
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Settings]:
    """An empty database of either kind, for migrating step by step."""
    if request.param == "sqlite":
        yield Settings(database_url=None, data_dir=tmp_path)
        return
    request.getfixturevalue("pg_url")  # PostgreSQL is reachable
    with _pg_schema("steps") as url:
        yield Settings(database_url=url)


def test_0005_packs_allowlist_rows_into_chunks_and_back(fresh: Settings) -> None:
    cfg = alembic_config(fresh)
    upgrade(fresh, "0004")
    engine = create_engine(fresh.sqlalchemy_url(asynchronous=False))
    values = [-(2**63), -1, 0, 5, 2**63 - 1]  # the u64 fingerprints 2^63, 2^64 - 1, 0, 5, 2^63 - 1 as BIGINT
    with engine.begin() as conn:
        for entry_id, label in ((1, "a"), (2, "b")):
            conn.execute(
                text(
                    "INSERT INTO allowlist_entries (id, key_id, label, origin, fingerprint_count, created_at,"
                    " created_by) VALUES (:id, '00112233445566aa', :label, 'import', :n, :at, 'k')"
                ),
                {"id": entry_id, "label": label, "n": len(values) if entry_id == 1 else 0, "at": datetime.now(UTC)},
            )
        conn.execute(
            text("INSERT INTO allowlist_fingerprints (entry_id, value) VALUES (1, :v)"), [{"v": v} for v in values]
        )
    upgrade(fresh)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT entry_id, seq, fingerprint_count, fingerprints FROM allowlist_chunks")).all()
    assert [(r[0], r[1], r[2]) for r in rows] == [(1, 0, 5)]  # an entry without fingerprints has no chunk
    assert np.frombuffer(rows[0][3], dtype="<u8").tolist() == [0, 5, 2**63 - 1, 2**63, 2**64 - 1]  # sorted unsigned
    command.downgrade(cfg, "0004")
    with engine.connect() as conn:
        back = conn.execute(text("SELECT entry_id, value FROM allowlist_fingerprints ORDER BY value")).all()
    assert [tuple(r) for r in back] == [(1, v) for v in values]
    engine.dispose()


def test_0009_renames_longest_run_words_in_the_column_and_the_evidence_and_back(fresh: Settings) -> None:
    cfg = alembic_config(fresh)
    upgrade(fresh, "0008")
    engine = create_engine(fresh.sqlalchemy_url(asynchronous=False))
    at = datetime.now(UTC)
    evidence = '{"scheme": {"n": 4}, "sources": [{"tenant": "a", "longest_run_words": 44, "coverage": 0.5}]}'
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO findings (id, key_id, recipient_tenant, recipient_request_id, source_tenant,"
                " source_request_ids, detected_at, updated_at, response_at, model, response_tokens,"
                " matched_fingerprints, longest_run_words, score, severity, evidence)"
                " VALUES (1, 'k', 'b', 'r-b', 'a', '[\"r-a\"]', :at, :at, :at, 'm', 120, 9, 44, 0.3, 'high', :ev)"
            ),
            {"at": at, "ev": evidence},
        )
    upgrade(fresh)

    def read(query: str) -> tuple[int, object]:
        with engine.connect() as conn:
            value, raw = conn.execute(text(query)).one()
        return value, raw if isinstance(raw, dict) else orjson.loads(raw)

    value, ev = read("SELECT longest_run_tokens, evidence FROM findings")
    assert value == 44
    assert ev == {"scheme": {"n": 4}, "sources": [{"tenant": "a", "longest_run_tokens": 44, "coverage": 0.5}]}
    command.downgrade(cfg, "0008")
    value, ev = read("SELECT longest_run_words, evidence FROM findings")
    assert value == 44
    assert ev == orjson.loads(evidence)
    engine.dispose()


def test_0010_sqlite_never_hands_out_an_id_twice(tmp_path: Path) -> None:
    """A purge or the retention job deletes the newest incident: the next one must not take its id."""
    settings = Settings(database_url=None, data_dir=tmp_path)
    cfg = alembic_config(settings)
    command.upgrade(cfg, "0009")
    engine = create_engine(settings.sqlalchemy_url(asynchronous=False))
    row = "insert into audit_log (at, key_id, action, target, detail) values ('2026-12-07', 'cli', 'a', :t, '{}')"
    with engine.begin() as conn:
        for target in ("one", "two"):
            conn.execute(text(row), {"t": target})
    upgrade(settings)
    with engine.begin() as conn:
        assert conn.execute(text("select id, target from audit_log order by id")).all() == [(1, "one"), (2, "two")]
        conn.execute(text("delete from audit_log where id = 2"))
        conn.execute(text(row), {"t": "three"})
        assert conn.execute(text("select id from audit_log where target = 'three'")).scalar() == 3
        tables: dict[str, str] = dict(
            conn.execute(text("select name, sql from sqlite_master where type = 'table'")).all()
        )
    ids = {name for name, sql in tables.items() if re.search(r"^\s+id INTEGER NOT NULL", sql, re.MULTILINE)}
    assert len(ids) == 8
    assert ids == {name for name, sql in tables.items() if "AUTOINCREMENT" in sql}
    engine.dispose()
