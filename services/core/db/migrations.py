"""Run the Alembic migrations programmatically (``kgstream db upgrade``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic.config import Config
from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError

from alembic import command

ROOT = Path(__file__).resolve().parents[3]
log = logging.getLogger(__name__)


def alembic_config(database_url: str, embedding_dim: int) -> Config:
    """An Alembic config pointing at the project's migrations and the given database."""
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "alembic"))
    cfg.attributes["database_url"] = database_url
    cfg.attributes["embedding_dim"] = embedding_dim
    return cfg


def upgrade(database_url: str, embedding_dim: int, revision: str = "head") -> None:
    """Bring the schema up to ``revision``, saying so in one line: alembic's own INFO lines
    (one per migration, with its docstring) go to DEBUG."""
    before = current_revision(database_url)
    with _quiet("alembic"):
        command.upgrade(alembic_config(database_url, embedding_dim), revision)
    after = current_revision(database_url)
    if after != before:
        log.info("database schema %s -> %s", before or "(empty)", after)


def current_revision(database_url: str) -> str | None:
    """The schema's alembic revision, or None before the first migration."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            found = conn.scalar(text("SELECT version_num FROM alembic_version"))
            return None if found is None else str(found)
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """The logger ``name`` at WARNING unless DEBUG is asked for, for the block."""
    logger = logging.getLogger(name)
    level = logger.level
    if not log.isEnabledFor(logging.DEBUG):
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
