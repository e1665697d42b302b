"""Engine and session factories. Built once by a composition root, passed everywhere else."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.core.errors import ConfigurationError


def make_engine(url: str, pool_size: int = 5) -> AsyncEngine:
    """An async engine on psycopg 3 (``postgresql+psycopg://``)."""
    return create_async_engine(url, pool_size=pool_size, max_overflow=5, pool_pre_ping=True)


async def check_schema(engine: AsyncEngine, embedding_dim: int) -> None:
    """Fail fast, with a message a person can act on, when the database does not fit us."""
    async with engine.connect() as conn:
        exists = await conn.scalar(text("SELECT to_regclass('public.kg_meta') IS NOT NULL"))
        if not exists:
            raise ConfigurationError(
                "the database has no kgstream schema: run `kgstream db upgrade` first"
            )
        stored = await conn.scalar(text("SELECT value FROM kg_meta WHERE key = 'embedding_dim'"))
    if stored is None or int(stored) != embedding_dim:
        raise ConfigurationError(
            f"embedding width mismatch: the database was built for {stored}-d vectors but "
            f"KGSTREAM_EMBEDDING_DIM is {embedding_dim}; use the same embedder, or a new database"
        )


def vector_literal(values: Sequence[float]) -> str:
    """pgvector's text form; bound as a parameter and cast with ``CAST(:v AS vector)``."""
    return "[" + ",".join(f"{v:.7g}" for v in values) + "]"
