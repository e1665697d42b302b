"""The passages a report's themes are read from, bounded so a recompute reads a fixed amount of
text per written report whatever the corpus size (docs/retrieval.md, "Global answers offline"):

- per community written, at most ``per_community`` passages mentioning its top members (the
  ones the report is written from), the most specific first: a passage scores the sum over the
  members it mentions of 1 / (passages mentioning that member), so a passage about two of the
  community's own members beats one that names a hub mentioned everywhere; ties by chunk id;
- the corpus sample the keyphrases are weighed against: at most SAMPLE passages, every k-th
  chunk id over the id range (deterministic, spread over the corpus's history, read by key).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.communities.report_plan import ReportPlan
from services.communities.structure import Structure

SAMPLE = 2000  # passages; frequencies of the words that matter settle well below this

_TOP_PASSAGES = text(
    "WITH wanted AS (SELECT * FROM unnest(CAST(:keys AS integer[]), CAST(:entities AS bigint[]))"
    "  AS w(k, entity_id)),"
    " hits AS (SELECT DISTINCT w.k, m.entity_id, m.chunk_id"
    "  FROM wanted w JOIN mentions m ON m.entity_id = w.entity_id),"
    " spread AS (SELECT entity_id, count(DISTINCT chunk_id) AS n FROM hits GROUP BY entity_id),"
    " scored AS (SELECT h.k, h.chunk_id, sum(1.0 / s.n) AS score"
    "  FROM hits h JOIN spread s ON s.entity_id = h.entity_id GROUP BY h.k, h.chunk_id),"
    " ranked AS (SELECT k, chunk_id,"
    "  row_number() OVER (PARTITION BY k ORDER BY score DESC, chunk_id) AS r FROM scored)"
    " SELECT k, chunk_id FROM ranked WHERE r <= :n ORDER BY k, r"
)
_ID_RANGE = text("SELECT min(id), max(id) FROM chunks")
_TEXTS = text("SELECT id, text FROM chunks WHERE id = ANY(:ids)")


@dataclass(frozen=True)
class Passages:
    """Chunk ids per written community (level, label), best first; the corpus sample's ids;
    and the texts of all of them."""

    by_community: dict[tuple[int, int], list[int]]
    sample: list[int]
    texts: dict[int, str]

    def of(self, community: tuple[int, int]) -> list[str]:
        """The community's passage texts, best first."""
        return [self.texts[c] for c in self.by_community.get(community, []) if c in self.texts]


NO_PASSAGES = Passages({}, [], {})


async def load_passages(
    conn: AsyncConnection, structure: Structure, plan: ReportPlan, per_community: int
) -> Passages:
    """Read in ``conn``'s snapshot; nothing when ``per_community`` is 0 or nothing is written."""
    keys: list[tuple[int, int]] = []
    key_of: list[int] = []
    entities: list[int] = []
    for number, level_plan in enumerate(plan.levels):
        for label, nodes in level_plan.top_nodes.items():
            ids = structure.graph.node_ids[nodes].tolist()
            key_of += [len(keys)] * len(ids)
            entities += ids
            keys.append((number, label))
    if per_community <= 0 or not keys:
        return NO_PASSAGES
    rows = await conn.execute(
        _TOP_PASSAGES, {"keys": key_of, "entities": entities, "n": per_community}
    )
    by_community: dict[tuple[int, int], list[int]] = {}
    for key, chunk_id in rows:
        by_community.setdefault(keys[key], []).append(int(chunk_id))
    sample = await _sample_ids(conn)
    wanted = sorted({c for ids in by_community.values() for c in ids} | set(sample))
    found = await conn.execute(_TEXTS, {"ids": wanted})
    texts = {int(r.id): str(r.text) for r in found}
    return Passages(by_community, [c for c in sample if c in texts], texts)


async def _sample_ids(conn: AsyncConnection) -> list[int]:
    low, high = (await conn.execute(_ID_RANGE)).one()
    if low is None:
        return []
    step = max(1, math.ceil((high - low + 1) / SAMPLE))
    return list(range(int(low), int(high) + 1, step))
