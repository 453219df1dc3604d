"""Alembic, driven from code so ``bleedwatch migrate`` works from an installed package too."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, make_url

from service.config import Settings


def migrations_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "migrations", here.parent / "migrations"):
        if (candidate / "env.py").exists():
            return candidate
    raise FileNotFoundError("the migrations/ directory is not installed beside the service package")


def alembic_config(settings: Settings) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("file_template", "%%(year)d_%%(month).2d_%%(day).2d_%%(rev)s_%%(slug)s")
    cfg.attributes["sqlalchemy_url"] = settings.sqlalchemy_url(asynchronous=False)
    if settings.database_url is None:
        settings.make_data_dir()
    return cfg


def upgrade(settings: Settings, revision: str = "head") -> None:
    command.upgrade(alembic_config(settings), revision)


def revision(settings: Settings) -> str | None:
    """The schema revision the database is at; None before the first migration."""
    engine = create_engine(alembic_config(settings).attributes["sqlalchemy_url"])
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def describe(settings: Settings) -> str:
    """The database, as an operator checks which one a command used: no password."""
    url = settings.database_url or settings.sqlalchemy_url(asynchronous=False)
    return make_url(url).render_as_string(hide_password=True)
