"""Local mode's chains on a real database (services/retrieval/chain_search.follow_chains): the later
hops of a 3-hop question are reached through bridge entities the indexer linked, and a name the
question states is not followed as a bridge."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from services.core.access import Caller
from services.core.db.engine import make_engine
from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps
from services.retrieval import chain_search
from services.retrieval.lexical import StatsCache
from tests.support.graph import apply_events
from tests.support.records import document_event

UNIT = [1.0] * Settings().embedding_dim  # a query embedding for the reached passages' cosine
QUESTION = "Which canal runs through the birthplace of the composer of Gloria in D major?"
DOCS = {
    # hop 1: the work names its composer (not the question's word "composer")
    "gloria": ("Gloria (Vivaldi)", "Gloria in D major, RV 589, is a sacred work written by "
               "Antonio Vivaldi around 1715."),
    # hop 2: the composer's article names his birthplace
    "vivaldi": ("Antonio Vivaldi", "Antonio Vivaldi was an Italian composer and violinist, "
                "born in Venice in 1678."),
    # hop 3: the birthplace's article names the canal (the answer)
    "venice": ("Venice", "Venice is a city in northeastern Italy, and the Grand Canal runs "
               "through its centre."),
    # a look-alike the first ranking likes
    "panama": ("Panama Canal", "The Panama Canal runs through Panama and links the Atlantic "
               "and Pacific oceans."),
}  # fmt: skip


async def _chunks(engine: Any) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT doc_id, id FROM chunks"))
        return {str(d): int(c) for d, c in rows.all()}


async def _entity(engine: Any, name: str) -> int:
    async with engine.connect() as conn:
        row = await conn.execute(text("SELECT id FROM entities WHERE name = :n"), {"n": name})
        return int(row.scalar_one())


async def _follow(
    engine: Any, fused: dict[int, float], seeds: list[int]
) -> tuple[list[int], tuple[int, ...]]:
    """The ranking with the chains' passages, and the best chain."""
    stats = await _stats(engine)

    async def flat(extra: dict[int, float]) -> dict[int, float]:
        # every candidate equally relevant on the dense and graph signals: what decides is
        # the chain rules and the question's uncovered terms
        known.update(extra)
        return dict.fromkeys(known, 1.0)

    known = set(fused)
    async with engine.connect() as conn:
        return await chain_search.follow_chains(
            conn,
            QUESTION,
            UNIT,  # the question's embedding: no signal here reads the cosine
            fused,
            seeds,
            width=3,
            steps=10,
            base=flat,
            stats=stats,
            lexical_weight=1.0,
            caller=Caller.operator(),
        )


async def _stats(engine: Any) -> Any:
    async with engine.connect() as conn:
        return await StatsCache().get(conn)


async def test_a_chain_reaches_the_third_hop_through_its_bridge_entities(
    deps: IndexerDeps, database_url: str
) -> None:
    events = [
        document_event(event_id=f"e-{key}", doc_id=key, title=title, text=body)
        for key, (title, body) in DOCS.items()
    ]
    assert set(await apply_events(deps, events)) == {"applied"}
    engine = make_engine(database_url)
    try:
        chunk = await _chunks(engine)
        gloria = await _entity(engine, "Gloria")
        # the first ranking found the work and the look-alike, not the later hops
        fused = {chunk["gloria"]: 2.0, chunk["panama"]: 1.0}
        ranked, best = await _follow(engine, fused, [gloria])
        assert ranked[:2] == [chunk["gloria"], chunk["panama"]]
        assert chunk["vivaldi"] in ranked
        assert chunk["venice"] in ranked
        assert ranked.index(chunk["vivaldi"]) < ranked.index(chunk["venice"])
        # the best chain, which the offline answer reads, is the three hops in order
        assert best[:3] == (chunk["gloria"], chunk["vivaldi"], chunk["venice"])

        # had the question named the composer, he is no bridge: nothing leads past hop 1
        vivaldi = await _entity(engine, "Antonio Vivaldi")
        assert chunk["venice"] not in (await _follow(engine, fused, [gloria, vivaldi]))[0]
    finally:
        await engine.dispose()
