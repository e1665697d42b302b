"""The in-memory walked graph (services/retrieval/graph_memory.py, issue 32 steps 2 and 4): after
any sequence of upserts, deletes, replays and stale events, with drawn ACLs (so that an upsert
of the same content may change only who can see it), refreshed at drawn points from the change
feed and built anew at others (the holding process restarted), the state it holds equals one
built from the database, access classes and evidence per class included."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
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


ACLS: list[list[str] | None] = [None, [], ["g1"], ["g1", "g2"]]


def _access(event: dict[str, Any], **access: Any) -> dict[str, Any]:
    """The event with these access fields (an unset one is left out: the contract has no
    null ACL or tenant)."""
    out = {k: v for k, v in event.items() if k not in access}
    out.update({k: v for k, v in access.items() if v is not None})
    return out


def _with_acls(events: list[dict[str, Any]], acls: list[int]) -> list[dict[str, Any]]:
    """Each event with the ACL drawn for its place (a replay is the same event, same ACL)."""
    first: dict[str, int] = {}
    out = []
    for i, event in enumerate(events):
        acl = ACLS[acls[first.setdefault(event["event_id"], i) % len(acls)]]
        out.append(_access(event, acl=acl))
    return out


@settings(max_examples=int(os.environ.get("KGSTREAM_PROPERTY_EXAMPLES", "10")), deadline=None)
@given(
    steps=scenarios(),
    refresh_at=st.sets(st.integers(0, 11), max_size=6),
    restart_at=st.frozensets(st.integers(0, 11), max_size=2),
    acls=st.lists(st.integers(0, len(ACLS) - 1), min_size=1, max_size=12),
)
@example(steps=KEPT_CHUNKS_MOVE, refresh_at={0, 1}, restart_at=frozenset(), acls=[0])
@example(
    steps=SHARED_EVIDENCE_SHRINKS, refresh_at={1, 2, 3}, restart_at=frozenset({2}), acls=[2, 3]
)
@example(steps=TOMBSTONE_HOLDS, refresh_at={0, 2}, restart_at=frozenset({1}), acls=[1, 0, 2])
def test_the_held_graph_equals_a_fresh_build(
    env: Env,
    steps: list[Step],
    refresh_at: set[int],
    restart_at: frozenset[int],
    acls: list[int],
) -> None:
    planned = plan(steps)
    url = create_database(env.server_url)
    try:
        events = _with_acls(planned.sent, acls)
        held, fresh = _run(_follow(env, url, events, refresh_at, restart_at))
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


CHANGES: list[dict[str, Any]] = [{"acl": ["g1"]}, {"acl": None}, {"acl": None, "tenant": "t1"}]


def test_an_access_change_alone_reaches_the_held_graph(env: Env) -> None:
    """The same content sent again with another ACL, then another tenant: no node or edge
    changes, yet a refresh gives the held graph the new access classes (the indexer logs
    ``access`` changes for the document's chunks)."""
    planned = plan([Step("upsert", "doc-einstein", 0, False, 1, 0, False)])
    first = planned.sent[0]
    at = datetime.fromisoformat(first["occurred_at"])
    again = [
        _access(first, event_id=f"acl-{i}", occurred_at=(at + timedelta(hours=i)).isoformat(), **a)
        for i, a in enumerate(CHANGES, start=1)
    ]
    url = create_database(env.server_url)

    async def go() -> list[set[Any]]:
        engine = make_engine(url)
        seen = []
        try:
            async with env.deps(url) as deps:
                await apply_events(deps, [first])
                held = await graph_memory.build(engine)
                for event in again:
                    await apply_events(deps, [event])
                    held = await graph_memory.refresh(engine, held)
                    fresh = await graph_memory.build(engine)
                    assert held.canonical() == fresh.canonical()
                    seen.append({edge[3] for edge in held.canonical()["passage_edges"]})
            return seen
        finally:
            await engine.dispose()

    try:
        assert _run(go()) == [{(None, ("g1",))}, {(None, None)}, {("t1", None)}]
    finally:
        drop_database(url)
