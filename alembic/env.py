"""Alembic environment: migrations run synchronously with psycopg 3."""

from __future__ import annotations

import os

from sqlalchemy import create_engine, pool

from alembic import context

config = context.config
url = config.attributes.get("database_url") or os.environ.get("KGSTREAM_DATABASE_URL")
if not url:
    raise SystemExit("no database URL: set KGSTREAM_DATABASE_URL or use `kgstream db upgrade`")
url = url.replace("postgresql://", "postgresql+psycopg://", 1)


def run_migrations_online() -> None:
    """Apply migrations in one transaction."""
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) mode is not supported: the schema depends on settings")
run_migrations_online()
