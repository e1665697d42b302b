"""Run the Alembic migrations programmatically (``kgstream db upgrade``)."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config

from alembic import command

ROOT = Path(__file__).resolve().parents[3]


def alembic_config(database_url: str, embedding_dim: int) -> Config:
    """An Alembic config pointing at the project's migrations and the given database."""
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "alembic"))
    cfg.attributes["database_url"] = database_url
    cfg.attributes["embedding_dim"] = embedding_dim
    return cfg


def upgrade(database_url: str, embedding_dim: int, revision: str = "head") -> None:
    """Bring the schema up to ``revision``."""
    command.upgrade(alembic_config(database_url, embedding_dim), revision)
