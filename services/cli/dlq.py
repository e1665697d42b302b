"""`kgstream dlq`: dead letters, listed and replayed."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Annotated, Any

import typer

from services.cli.common import JsonFlag, group
from services.cli.common import settings as _settings

dlq_app = group("Dead letters: list and replay.")


@dlq_app.command("list")
def dlq_list(
    json_out: JsonFlag = False,
    include_replayed: Annotated[bool, typer.Option("--all", help="Include replayed.")] = False,
    limit: Annotated[int, typer.Option(min=1)] = 100,
) -> None:
    """Dead letters, newest first, with their reasons."""
    from services.core.db.engine import DbTimeouts, make_engine
    from services.core.dead_letters import list_dead_letters
    from services.core.infra.manager import resolve_endpoints

    settings = _settings()
    engine = make_engine(
        resolve_endpoints(settings).database_url, timeouts=DbTimeouts.from_settings(settings)
    )

    async def go() -> list[Any]:
        try:
            return await list_dead_letters(engine, include_replayed=include_replayed, limit=limit)
        finally:
            await engine.dispose()

    letters = asyncio.run(go())
    if json_out:
        typer.echo(json.dumps([d.to_dict() for d in letters], indent=2))
        return
    for d in letters:
        where = f"{d.topic}/{d.partition}@{d.offset}"
        typer.echo(f"#{d.id} {d.created_at:%Y-%m-%d %H:%M:%S} {where} {d.reason}: {d.detail[:160]}")
    typer.echo(f"{len(letters)} dead letter(s)")


@dlq_app.command("replay")
def dlq_replay(
    ids: Annotated[list[int] | None, typer.Option("--id", help="Only these ids.")] = None,
    topic: Annotated[str | None, typer.Option(help="Target (default: documents topic).")] = None,
) -> None:
    """Publish dead letters' raw payloads again (after fixing their cause), oldest first; each
    is marked replayed once the broker has acknowledged it. One run sends each letter there was
    when it started at most once (a record that fails again is a new letter, for the next run).
    Exit code 1 when any was refused."""
    from services.cli.dlq_replay import replay
    from services.core.db.engine import DbTimeouts, make_engine
    from services.core.infra.manager import resolve_endpoints

    settings = _settings()
    endpoints = resolve_endpoints(settings)
    engine = make_engine(endpoints.database_url, timeouts=DbTimeouts.from_settings(settings))

    async def go() -> int:
        try:
            target = topic or settings.documents_topic
            return await replay(
                engine, settings, endpoints.kafka_bootstrap_servers, ids or [], target
            )
        finally:
            await engine.dispose()

    sys.exit(asyncio.run(go()))
