"""An LLM follow-up's local retrieval continues the chains from the passages found so far
(services/retrieval/multistep.py, chains.ChainStart) on the indexed sample: the film a town's
passage names is reached through the entity the follow-up query names."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.db.engine import make_engine
from services.core.settings import Settings
from services.retrieval.chain_search import follow_chains
from services.retrieval.chains import ChainStart
from services.retrieval.lexical import StatsCache

pytestmark = pytest.mark.integration

UNIT = [1.0] * Settings().embedding_dim  # a query embedding for the reached passages' cosine
LELAND = "hotpotqa-aebaeed5d73f"  # "... movies, such as "Maximum Overdrive" (1986) ..."
MAXIMUM_OVERDRIVE = "hotpotqa-d50de2bed6aa"  # the film's own article
OTHERS = ("hotpotqa-2f74b64c93a4", "hotpotqa-64cdc59d5cd6")  # a brewery, a basketball team
# The passage's chunk and the entity it is about (its title's: a mention without offsets).
_ABOUT = text(
    "SELECT c.id, m.entity_id FROM chunks c JOIN mentions m ON m.chunk_id = c.id"
    " WHERE c.doc_id = :d AND m.start_char < 0"
)


async def about(conn: AsyncConnection, doc_id: str) -> tuple[int, int]:
    chunk, entity = (await conn.execute(_ABOUT, {"d": doc_id})).one()
    return int(chunk), int(entity)


async def test_a_follow_up_continues_the_chain_through_the_entity_it_names(
    sample_db: str,
) -> None:
    engine = make_engine(sample_db)
    async with engine.connect() as conn:
        leland, town = await about(conn, LELAND)
        film_passage, film = await about(conn, MAXIMUM_OVERDRIVE)
        others = [(await about(conn, d))[0] for d in OTHERS]
        stats = await StatsCache().get(conn)

        async def only_the_film_is_relevant(extra: dict[int, float]) -> dict[int, float]:
            return {c: 1.0 if c == film_passage else -1.0 for c in extra}

        async def ranking(start: ChainStart | None) -> list[int]:
            # The follow-up's own fused ranking holds neither passage, so only a chain can
            # bring the film's passage in.
            order, _ = await follow_chains(
                conn,
                "Maximum Overdrive",  # the follow-up query: it names the bridge
                UNIT,  # its embedding: no signal here reads the cosine
                {others[0]: 2.0, others[1]: 1.0},
                [film],  # the follow-up query's seed
                width=3,
                steps=3,
                base=only_the_film_is_relevant,
                stats=stats,
                lexical_weight=0.0,
                caller=Caller.operator(),
                start=start,
            )
            return order

        # From the town's passage found by the first search, through the film it names (the
        # question named only the town): the film's passage, and not the head again.
        continued = await ranking(ChainStart((leland,), frozenset({town})))
        assert continued == [others[0], film_passage, others[1]]
        # The film as a used entity (as the follow-up's own chains treat their seed): no step.
        assert await ranking(ChainStart((leland,), frozenset({town, film}))) == others
        # Restarted at the follow-up's own best passages: nothing links them to the film.
        assert await ranking(None) == others
    await engine.dispose()
