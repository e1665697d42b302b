"""`kgstream dlq replay`: dead letters back to their topic, with one outcome per letter and an
exit code that says whether every one went (services/core/dead_letters.py does the work)."""

from __future__ import annotations

from collections.abc import Sequence

import typer
from kafka.errors import KafkaError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.dead_letters import NOT_REPLAYABLE, list_dead_letters, replay_dead_letters
from services.core.producer import make_producer
from services.core.settings import Settings

UNKNOWN_IDS = 2
NOT_ALL_REPLAYED = 1


async def replay(
    engine: AsyncEngine, settings: Settings, bootstrap: str, ids: Sequence[int], topic: str
) -> int:
    """Replay the unreplayed letters (or only ``ids``) to ``topic``; print each one the broker
    refused with its reason, then the counts. Returns the exit code: 0 when all went, 1 when
    any did not (they stay unreplayed), 2 when an id names no unreplayed letter. Letters that
    can never be replayed (an unreadable record batch) are left alone with one notice when no
    ``ids`` are given, and count as not replayed when their id is."""
    if ids:
        found = {d.id for d in await list_dead_letters(engine, ids=ids, limit=len(ids))}
        if missing := sorted(set(ids) - found):
            _error(f"no unreplayed dead letter with id {missing}")
            return UNKNOWN_IDS
    try:
        producer = make_producer(bootstrap, settings)
    except KafkaError as exc:
        _error(f"cannot reach the broker at {bootstrap}: {exc}")
        return NOT_ALL_REPLAYED
    sent = failed = 0
    left_alone: list[int] = []
    try:
        async for outcome in replay_dead_letters(engine, producer, topic, ids=ids):
            if outcome.error is None:
                sent += 1
            elif outcome.not_replayable and not ids:
                left_alone.append(outcome.letter_id)
            else:
                failed += 1
                _error(f"dead letter #{outcome.letter_id} not replayed: {outcome.error}")
    except SQLAlchemyError as exc:
        # Letters sent but not yet marked stay unreplayed; sending them again is harmless.
        _error(f"stopped, the database failed: {type(exc).__name__}: {exc}")
        failed += 1
    finally:
        producer.close()
    if left_alone:
        listed = ", ".join(f"#{i}" for i in left_alone)
        typer.echo(
            f"{len(left_alone)} unreadable batch letter(s) left alone: {listed} "
            f"({NOT_REPLAYABLE['undecodable_batch']})",
            err=True,
        )
    tail = f", {failed} not replayed" if failed else ""
    typer.echo(f"replayed {sent} dead letter(s){tail}")
    return NOT_ALL_REPLAYED if failed else 0


def _error(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
