"""Local mode's graph reads from memory (services/retrieval/graph_walk.py) answer what the
database statements (neighbourhood.DbGraphReads) answer a caller who sees everything, on the
48-document sample: every read, for drawn seed sets and passage sets, with the hub and bridge
bounds as set and small enough that the sample meets them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from services.core.access import Caller
from services.core.db.engine import make_engine
from services.retrieval import graph_memory, neighbourhood
from services.retrieval.graph_walk import MemoryGraphReads
from tests.integration.test_graph_properties import _run

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
    seeds = data.draw(st.lists(st.sampled_from(entities), min_size=1, max_size=4, unique=True))
    passages = data.draw(st.lists(st.sampled_from(chunks), max_size=6, unique=True))
    known = data.draw(st.lists(st.sampled_from(entities), max_size=20, unique=True))
    hub, budget = bounds

    async def go() -> None:
        engine = make_engine(sample_db)
        saved = neighbourhood.HUB_MENTIONS, neighbourhood.MAX_BRIDGE_MENTIONS
        neighbourhood.HUB_MENTIONS, neighbourhood.MAX_BRIDGE_MENTIONS = hub, budget
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
                for name, args in [
                    ("not_hubs", (seeds + known,)),
                    ("mentions_of", (seeds,)),
                    ("bridge_step", (passages, known)),
                    ("about", (passages,)),
                ]:
                    a, b = [await getattr(r, name)(*args) for r in (db, memory)]
                    ordered = name == "not_hubs"  # rarest first; the others are sets of pairs
                    assert (a if ordered else sorted(a)) == (b if ordered else sorted(b)), name
                shown_db = await neighbourhood.around(db, seeds, hide_weak=hide_weak)
                shown_memory = await neighbourhood.around(memory, seeds, hide_weak=hide_weak)
                await memory.describe(shown_memory, neighbourhood.SHOWN_HOPS)
                first = slice(0, neighbourhood.SHOWN_HOPS)
                assert shown_memory.relations[first] == shown_db.relations[first]
                for s, t, *_ in shown_db.relations[first]:
                    assert shown_memory.names[s] == shown_db.names[s]
                    assert shown_memory.names[t] == shown_db.names[t]
        finally:
            neighbourhood.HUB_MENTIONS, neighbourhood.MAX_BRIDGE_MENTIONS = saved
            await engine.dispose()

    _run(go())
