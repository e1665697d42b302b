"""What holding the walked graph in memory costs (issue 32, step 2; services/retrieval/
graph_memory.py) on a bulk-built home (bench/bulk_build.py):

    flock /tmp/kg-heavy.lock .venv/bin/python bench/bench_graph_memory.py \
        --home /var/tmp/kg-bulk-38k [--runs 3] [--out F]

Starts the home's PostgreSQL and migrates it, then builds the state ``--runs`` times (one bulk
read of an exact snapshot) and refreshes it with no change: seconds of each (the median), the
rows, and the bytes of the arrays (per million entities).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_bulk_scale import _quarter_of_memory  # noqa: E402
from sqlalchemy import text  # noqa: E402

from services.core.db import migrations  # noqa: E402
from services.core.db.engine import make_engine  # noqa: E402
from services.core.infra.postgres import EmbeddedPostgres  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.retrieval import graph_memory  # noqa: E402

# A change row for the first entity and the first relationship (their rows are as they were:
# the refresh reads them again and replaces them, which is the work a real change costs).
_ONE_CHANGE = text(
    "INSERT INTO graph_changes (kind, ref_id, op, doc_id) SELECT 'node', min(id), 'change',"
    " 'bench-graph-memory' FROM entities UNION ALL SELECT 'edge', min(id), 'change',"
    " 'bench-graph-memory' FROM relationships"
)


async def _measure(url: str, runs: int) -> dict[str, Any]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            entities = int(await conn.scalar(text("SELECT count(*) FROM entities")) or 0)
        builds, refreshes = [], []
        held = None
        for _ in range(runs):
            t0 = time.perf_counter()
            held = await graph_memory.build(engine)
            builds.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await graph_memory.refresh(engine, held)
            refreshes.append(time.perf_counter() - t0)
        assert held is not None
        changed = []  # a refresh that takes one changed entity and one changed relationship
        for _ in range(runs):
            async with engine.begin() as conn:
                await conn.execute(_ONE_CHANGE)
            t0 = time.perf_counter()
            held = await graph_memory.refresh(engine, held)
            changed.append(time.perf_counter() - t0)
        async with engine.begin() as conn:  # the marker rows out again (the state is unchanged)
            await conn.execute(text("DELETE FROM graph_changes WHERE op = 'change'"
                                    " AND doc_id = 'bench-graph-memory'"))  # fmt: skip
        return {
            "entities": entities,
            "passage_edges": int(held.edges.entities.size),
            "relationships": int(held.relationships.ids.size),
            "build_s": round(statistics.median(builds), 2),
            "refresh_unchanged_ms": round(statistics.median(refreshes) * 1000, 1),
            "refresh_one_change_ms": round(statistics.median(changed) * 1000, 1),
            "mb": round(held.nbytes / 1e6, 1),
            "mb_per_million_entities": round(held.nbytes / 1e6 / max(entities, 1) * 1e6, 1),
        }
    finally:
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--home", type=Path, required=True, help="a bulk-built home")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    settings = Settings()
    pg = EmbeddedPostgres(args.home, settings.embedded_user, shared_buffers=_quarter_of_memory())
    url = pg.start()
    try:
        migrations.upgrade(url, settings.embedding_dim)
        report = asyncio.run(_measure(url, args.runs))
    finally:
        pg.stop()
    out = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(out + "\n")
    print(out)


if __name__ == "__main__":
    main()
