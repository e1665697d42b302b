"""What a retrieval mode hands back to the service, and chunk rows turned into contexts."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.retrieval.answer_span import TOP_CONTEXTS, Mention
from services.retrieval.schemas import CommunityHit, Context, Hop, Mode, Route
from services.retrieval.vector import CURRENT, PassageReads, Ranked, load_chunks


@dataclass
class Retrieval:
    """One mode's result."""

    mode: Mode
    contexts: list[Context]
    hops: list[Hop] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    communities: list[CommunityHit] = field(default_factory=list)
    grounded: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mentions: list[Mention] = field(default_factory=list)  # in the contexts (offline answers)
    seeds: list[int] = field(default_factory=list)  # local: the question's grounded entity ids
    chain: tuple[int, ...] = ()  # local: the best chain of passages (chunk ids in hop order)


def answer_contexts(result: Retrieval) -> list[Context]:
    """The contexts the offline answer reads: the top ones and the best chain's passages."""
    chained = set(result.chain)
    return [c for i, c in enumerate(result.contexts) if i < TOP_CONTEXTS or c.chunk_id in chained]


# The entities the indexer found in chunks the caller has already been shown: surfaces and
# labels come from those chunks' own text, so no visibility filter is needed.
_CONTEXT_MENTIONS = text(
    "SELECT chunk_id, surface, type FROM mentions WHERE chunk_id = ANY(:c) ORDER BY chunk_id, id"
)


async def context_mentions(conn: AsyncConnection, contexts: list[Context]) -> list[Mention]:
    """The mentions in these (already visible) contexts."""
    if not contexts:
        return []
    rows = await conn.execute(_CONTEXT_MENTIONS, {"c": [c.chunk_id for c in contexts]})
    return [Mention(int(c), str(s), str(t)) for c, s, t in rows.all()]


async def contexts_for(
    conn: AsyncConnection, ranked: Ranked, *, caller: Caller, reads: PassageReads = CURRENT
) -> list[Context]:
    """The ranked chunks the caller can see as contexts, in rank order (the last guard: every
    mode's chunks pass through here)."""
    rows = await load_chunks(conn, ranked.ids, caller=caller, reads=reads)
    return [
        Context(
            doc_id=rows[c].doc_id,
            chunk_id=c,
            title=rows[c].title,
            text=rows[c].text,
            score=round(ranked.scores[c], 6),
            why=ranked.why.get(c, ""),
        )
        for c in ranked.ids
        if c in rows
    ]
