"""Local mode's graph reads from memory (services/retrieval/graph_walk.py) answer what the
database statements (neighbourhood.DbGraphReads) answer, on the 48-document sample: a caller who
sees everything, and a restricted caller over drawn tenants and ACLs; every read, for drawn seed
sets and passage sets, with the hub and bridge bounds as set and small enough that the sample
meets them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from services.core.access import Caller
from services.core.db.engine import make_engine
from services.retrieval import graph_memory, neighbourhood
from services.retrieval.graph_walk import MemoryGraphReads
from services.retrieval.visibility import entity_facts, entity_names
from tests.integration.test_graph_properties import _run
from tests.support.access import ACCESS, CALLERS, assign
from tests.support.graph import drop_database
from tests.support.query_fixtures import clone_database

pytestmark = pytest.mark.integration

# (hub, bridge budget): as set, and small enough that the sample's entities are hubs and its
# bridges are cut (the sample's most mentioned entity has a few dozen mentions).
BOUNDS = [
    (neighbourhood.HUB_MENTIONS, neighbourhood.MAX_BRIDGE_MENTIONS),
    (3, 12),
    (1, 2),
]


def _comparable(hood: neighbourhood.LocalGraph) -> dict[str, Any]:
    return {
        "relations": [(s, t, y, w) for s, t, y, w, _ in hood.relations],
        "mentions": sorted(hood.mentions),
        "entities": sorted(hood.names),
        "counts": hood.mention_counts,
    }


async def _ids(url: str) -> tuple[list[int], list[int]]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            entities = (await conn.execute(text("SELECT id FROM entities ORDER BY id"))).all()
            chunks = (await conn.execute(text("SELECT id FROM chunks ORDER BY id"))).all()
        return [int(r[0]) for r in entities], [int(r[0]) for r in chunks]
    finally:
        await engine.dispose()


@pytest.fixture(scope="module")
def sample_ids(sample_db: str) -> tuple[list[int], list[int]]:
    return _run(_ids(sample_db))


def _drawn(
    data: st.DataObject, entities: list[int], chunks: list[int]
) -> tuple[list[int], list[int], list[int]]:
    """Seeds, passages and known entities to read from."""
    seeds = data.draw(st.lists(st.sampled_from(entities), min_size=1, max_size=4, unique=True))
    passages = data.draw(st.lists(st.sampled_from(chunks), max_size=6, unique=True))
    known = data.draw(st.lists(st.sampled_from(entities), max_size=20, unique=True))
    return seeds, passages, known


@contextmanager
def _bounds(hub: int, budget: int) -> Iterator[None]:
    saved = neighbourhood.HUB_MENTIONS, neighbourhood.MAX_BRIDGE_MENTIONS
    neighbourhood.HUB_MENTIONS, neighbourhood.MAX_BRIDGE_MENTIONS = hub, budget
    try:
        yield
    finally:
        neighbourhood.HUB_MENTIONS, neighbourhood.MAX_BRIDGE_MENTIONS = saved


async def _steps_agree(
    db: neighbourhood.DbGraphReads,
    memory: MemoryGraphReads,
    seeds: list[int],
    known: list[int],
    passages: list[int],
) -> None:
    """Each read but ``relations`` answers the same from both sides."""
    for name, args in [
        ("not_hubs", (seeds + known,)),
        ("mentions_of", (seeds,)),
        ("bridge_step", (passages, known)),
        ("about", (passages,)),
    ]:
        a, b = [await getattr(r, name)(*args) for r in (db, memory)]
        if name == "about":  # the statement reads the titles of any passage it is given (a
            # walk gives it visible ones only); memory keeps the visible ones itself
            visible = {c for _, c in await db.mentions_of(sorted({e for _, e in a}))}
            a = [(c, e) for c, e in a if c in visible]
        ordered = name == "not_hubs"  # rarest first; the others are sets of pairs
        assert (a if ordered else sorted(a)) == (b if ordered else sorted(b)), name


@settings(max_examples=25, deadline=None)
@given(data=st.data(), bounds=st.sampled_from(BOUNDS), hide_weak=st.booleans())
def test_memory_reads_equal_the_database_statements(
    sample_db: str,
    sample_ids: tuple[list[int], list[int]],
    data: st.DataObject,
    bounds: tuple[int, int],
    hide_weak: bool,
) -> None:
    entities, chunks = sample_ids
    seeds, passages, known = _drawn(data, entities, chunks)
    hub, budget = bounds

    async def go() -> None:
        engine = make_engine(sample_db)
        try:
            held = await graph_memory.build(engine)
            async with engine.connect() as conn:
                db = neighbourhood.DbGraphReads(conn, Caller.operator())
                memory = MemoryGraphReads(held, conn)
                for reads in (db, memory):
                    assert isinstance(reads, neighbourhood.GraphReads)
                got = [
                    _comparable(await neighbourhood.around(r, seeds, hide_weak=hide_weak))
                    for r in (db, memory)
                ]
                assert got[0] == got[1]
                await _steps_agree(db, memory, seeds, known, passages)
                shown_db = await neighbourhood.around(db, seeds, hide_weak=hide_weak)
                shown_memory = await neighbourhood.around(memory, seeds, hide_weak=hide_weak)
                await memory.describe(shown_memory, neighbourhood.SHOWN_HOPS)
                first = slice(0, neighbourhood.SHOWN_HOPS)
                assert shown_memory.relations[first] == shown_db.relations[first]
                for s, t, *_ in shown_db.relations[first]:
                    assert shown_memory.names[s] == shown_db.names[s]
                    assert shown_memory.names[t] == shown_db.names[t]
        finally:
            await engine.dispose()

    with _bounds(hub, budget):
        _run(go())


# Restricted callers (issue 32, step 4): the sample with drawn tenants and ACLs, a caller of
# drawn tenant and groups; memory walks by its mask of access classes, the database by the
# visibility predicate.


async def _docs(url: str) -> list[str]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(text("SELECT doc_id FROM documents ORDER BY 1"))).all()
        return [str(r[0]) for r in rows]
    finally:
        await engine.dispose()


@pytest.fixture(scope="module")
def restricted_db(sample_db: str) -> Any:
    url = clone_database(sample_db, sample_db.rsplit("/", 1)[1])
    yield url, _run(_docs(url))
    drop_database(url)


def _weighed(relations: list[neighbourhood.Relation]) -> list[tuple[Any, ...]]:
    """Relations by weight (summed in another order by each side: equal to 9 digits), then
    ends and type."""
    return sorted((-round(w, 9), s, t, y) for s, t, y, w, _ in relations)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), bounds=st.sampled_from(BOUNDS), hide_weak=st.booleans())
def test_a_restricted_callers_memory_reads_equal_its_database_statements(
    restricted_db: tuple[str, list[str]],
    sample_ids: tuple[list[int], list[int]],
    data: st.DataObject,
    bounds: tuple[int, int],
    hide_weak: bool,
) -> None:
    url, docs = restricted_db
    entities, chunks = sample_ids
    access = {d: data.draw(ACCESS) for d in docs}
    caller = data.draw(CALLERS)
    seeds, passages, known = _drawn(data, entities, chunks)
    hub, budget = bounds

    async def go() -> None:
        engine = make_engine(url)
        try:
            async with engine.begin() as conn:
                await assign(conn, access)
            held = await graph_memory.build(engine)
            async with engine.connect() as conn:
                db = neighbourhood.DbGraphReads(conn, caller)
                memory = MemoryGraphReads(held, conn, caller)
                hoods = [
                    await neighbourhood.around(r, seeds, hide_weak=hide_weak) for r in (db, memory)
                ]
                assert _weighed(hoods[0].relations) == _weighed(hoods[1].relations)
                assert sorted(hoods[0].mentions) == sorted(hoods[1].mentions)
                assert sorted(hoods[0].names) == sorted(hoods[1].names)
                assert hoods[0].mention_counts == hoods[1].mention_counts
                await _steps_agree(db, memory, seeds, known, passages)
                facts = await entity_facts(conn, caller, seeds + known)
                named = await entity_names(conn, caller, seeds + known)
                assert named == {e: (f.name, f.mentions) for e, f in facts.items()}
                await memory.describe(hoods[1], neighbourhood.SHOWN_HOPS)
                shown = {(s, t, y): x for s, t, y, _, x in hoods[0].relations}
                for s, t, y, _, x in hoods[1].relations[: neighbourhood.SHOWN_HOPS]:
                    assert shown[(s, t, y)] == x
                    assert hoods[1].names[s] == hoods[0].names[s]
                    assert hoods[1].names[t] == hoods[0].names[t]
        finally:
            await engine.dispose()

    with _bounds(hub, budget):
        _run(go())
