"""What every `kgstream` command group shares: the settings with logging set up, a clear
failure, and a database engine for one command."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from services.core.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def group(help_text: str, **options: object) -> typer.Typer:
    """A command group as every `kgstream` group is made: help when called bare, and help text
    read as Markdown, so a docstring's paragraphs wrap at the terminal's width instead of at its
    source lines."""
    return typer.Typer(
        no_args_is_help=True,
        rich_markup_mode="markdown",
        help=help_text,
        **options,  # type: ignore[arg-type]
    )


def settings(process: str = "cli") -> Settings:
    """The settings, and logging set up for ``process`` (KGSTREAM_LOG_LEVEL, _LOG_FORMAT)."""
    from services.core.cpu_budget import cpu_threads, size_thread_pools
    from services.core.logs import setup_logging

    found = Settings()
    setup_logging(found.log_level, found.log_format, process)
    # Before numpy, onnxruntime and spaCy load: they size their thread pools once.
    size_thread_pools(cpu_threads(found.cpu_threads))
    return found


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: message`` in red on stderr; raise the returned Exit."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code)


def with_engine(work: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    """Run ``work`` on an engine for the configured database, disposed afterwards."""
    from services.core.db.engine import DbTimeouts, make_engine
    from services.core.infra.manager import resolve_endpoints

    found = settings()
    engine = make_engine(
        resolve_endpoints(found).database_url, timeouts=DbTimeouts.from_settings(found)
    )

    async def go() -> T:
        try:
            return await work(engine)
        finally:
            await engine.dispose()

    return asyncio.run(go())
