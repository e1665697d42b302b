"""Engine and session factories. Built once by a composition root, passed everywhere else."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from sqlalchemy import Connection, event, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.core.errors import ConfigurationError
from services.core.settings import Settings


@dataclass(frozen=True)
class DbTimeouts:
    """Bounds on every connection of an engine: how long connecting may take (libpq's
    connect_timeout, whole seconds, at least 2) and how long one statement may run on the
    server (statement_timeout; 0 = no limit). Without them a database that stops answering
    holds a caller for as long as it is stopped (issue 18, finding 10)."""

    connect_s: int = 5
    statement_s: float = 60.0

    @classmethod
    def from_settings(cls, settings: Settings, statement_s: float | None = None) -> Self:
        """The configured bounds; ``statement_s`` for a process with its own (longer) one."""
        return cls(
            connect_s=settings.db_connect_timeout_s,
            statement_s=settings.db_statement_timeout_s if statement_s is None else statement_s,
        )

    def connect_args(self) -> dict[str, object]:
        """psycopg connect arguments carrying both bounds."""
        return {
            "connect_timeout": max(2, self.connect_s),
            "options": f"-c statement_timeout={round(self.statement_s * 1000)}",
        }


UNBOUNDED = DbTimeouts(statement_s=0)
"""For offline tools (benchmarks at 1M rows, bulk loads): no bound on a statement."""

_NO_STATEMENT_BOUND = "kgstream_no_statement_bound"


def without_statement_bound(engine: AsyncEngine) -> AsyncEngine:
    """The same engine (the same pool) whose transactions run with no statement_timeout
    (``SET LOCAL``, so the connection is bounded again once it is back in the pool). For the
    retry of work a bound cut that is slow, not stuck (docs/ingest.md, Failures)."""
    return engine.execution_options(**{_NO_STATEMENT_BOUND: True})


def _lift_statement_bound(conn: Connection) -> None:
    if conn.get_execution_options().get(_NO_STATEMENT_BOUND):
        conn.exec_driver_sql("SET LOCAL statement_timeout = 0")


def make_engine(
    url: str,
    pool_size: int = 5,
    *,
    timeouts: DbTimeouts | None = None,
    max_overflow: int = 5,
) -> AsyncEngine:
    """An async engine on psycopg 3 (``postgresql+psycopg://``), every connection bounded by
    ``timeouts`` (the defaults when None)."""
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        connect_args=(timeouts or DbTimeouts()).connect_args(),
    )
    event.listen(engine.sync_engine, "begin", _lift_statement_bound)
    return engine


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
