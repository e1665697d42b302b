"""The in-memory walked graph (services/retrieval/graph_memory.py, issue 32 step 2): after any
sequence of upserts, deletes, replays and stale events, refreshed at drawn points from the
change feed and built anew at others (the holding process restarted), the state it holds
equals one built from the database."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from services.core.db.engine import make_engine
from services.retrieval import graph_memory
from tests.integration.test_graph_properties import (
    KEPT_CHUNKS_MOVE,
    SHARED_EVIDENCE_SHRINKS,
    TOMBSTONE_HOLDS,
    Step,
    _run,
    plan,
    scenarios,
)
from tests.support.graph import apply_events, create_database, drop_database
from tests.support.property_corpus import Env

pytestmark = pytest.mark.integration


async def _follow(
    env: Env,
    url: str,
    events: list[dict[str, Any]],
    refresh_at: set[int],
    restart_at: frozenset[int] = frozenset(),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Apply ``events`` one by one, refreshing the held graph after those in ``refresh_at``
    and building it anew after those in ``restart_at`` (then refreshing on from there), and
    refreshing at the end; the held state and a fresh build, as comparable data."""
    engine = make_engine(url)
    try:
        held = await graph_memory.build(engine)
        async with env.deps(url) as deps:
            for i, event in enumerate(events):
                await apply_events(deps, [event])
                if i in restart_at:
                    held = await graph_memory.build(engine)
                elif i in refresh_at:
                    held = await graph_memory.refresh(engine, held)
        held = await graph_memory.refresh(engine, held)
        fresh = await graph_memory.build(engine)
        assert held.watermark == fresh.watermark
        return held.canonical(), fresh.canonical()
    finally:
        await engine.dispose()


@settings(max_examples=int(os.environ.get("KGSTREAM_PROPERTY_EXAMPLES", "10")), deadline=None)
@given(
    steps=scenarios(),
    refresh_at=st.sets(st.integers(0, 11), max_size=6),
    restart_at=st.frozensets(st.integers(0, 11), max_size=2),
)
@example(steps=KEPT_CHUNKS_MOVE, refresh_at={0, 1}, restart_at=frozenset())
@example(steps=SHARED_EVIDENCE_SHRINKS, refresh_at={1, 2, 3}, restart_at=frozenset({2}))
@example(steps=TOMBSTONE_HOLDS, refresh_at={0, 2}, restart_at=frozenset({1}))
def test_the_held_graph_equals_a_fresh_build(
    env: Env, steps: list[Step], refresh_at: set[int], restart_at: frozenset[int]
) -> None:
    planned = plan(steps)
    url = create_database(env.server_url)
    try:
        held, fresh = _run(_follow(env, url, planned.sent, refresh_at, restart_at))
        assert held == fresh
    finally:
        drop_database(url)


def test_a_refresh_without_changes_keeps_the_state(env: Env) -> None:
    url = create_database(env.server_url)

    async def go() -> None:
        engine = make_engine(url)
        try:
            held = await graph_memory.build(engine)
            assert await graph_memory.refresh(engine, held) is held
            assert held.nbytes >= 0
        finally:
            await engine.dispose()

    try:
        _run(go())
    finally:
        drop_database(url)
