"""Models and migrations never drift, on both databases; migrations also go down cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, inspect

from service.config import Settings
from service.migrate import alembic_config, upgrade


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
