"""Alembic, driven from code so ``bleedwatch migrate`` works from an installed package too."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

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
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    return cfg


def upgrade(settings: Settings, revision: str = "head") -> None:
    command.upgrade(alembic_config(settings), revision)
