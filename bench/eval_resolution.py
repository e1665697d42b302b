"""Entity resolution on a real corpus: ingest the events through the indexer's handler into a
fresh embedded PostgreSQL, then list (a) merges across different surface keys and (b) remaining
candidate duplicates, for review by hand; prints counts and writes samples as JSON.

    .venv/bin/python bench/eval_resolution.py [EVENTS.jsonl] [--sample 40] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.core.db import migrations  # noqa: E402
from services.core.db.engine import UNBOUNDED, make_engine  # noqa: E402
from services.core.embedding import OnnxMiniLmEmbedder  # noqa: E402
from services.core.extraction import SpacyExtractor  # noqa: E402
from services.core.infra.postgres import EmbeddedPostgres  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.indexer.handlers import IndexerDeps, RawRecord, handle_batch  # noqa: E402

DEFAULT = ROOT.parent / "shared" / "data" / "hotpotqa-train100" / "events.jsonl"

MERGES = """
SELECT e.name, e.type_group, a.alias FROM aliases a JOIN entities e ON e.id = a.entity_id
WHERE a.alias_key <> e.key ORDER BY e.name, a.alias
"""
# Pairs that a person would suspect: one key is a whole-word suffix/prefix of the other, or the
# names are trigram-similar, within compatible groups.
CANDIDATES = """
SELECT a.name, a.type_group, b.name, b.type_group, similarity(a.name, b.name) AS sim
FROM entities a JOIN entities b ON a.id < b.id
WHERE (a.type_group = b.type_group OR 'ANY' IN (a.type_group, b.type_group))
  AND (similarity(a.name, b.name) >= 0.5
       OR b.key LIKE '% ' || a.key OR a.key LIKE '% ' || b.key
       OR b.key LIKE a.key || ' %' OR a.key LIKE b.key || ' %')
ORDER BY sim DESC
"""


async def run(events: Path, sample: int, out: Path | None) -> None:
    home = Path(tempfile.mkdtemp(prefix="kg-eval-"))
    pg = EmbeddedPostgres(home)
    url = pg.start()
    try:
        migrations.upgrade(url, 384)
        settings = Settings(home=home, database_url=url)
        engine = make_engine(url, timeouts=UNBOUNDED)

        async def no_dlq(_key: bytes | None, value: bytes) -> None:
            raise RuntimeError(f"unexpected dead letter: {value[:200]!r}")

        deps = IndexerDeps.from_settings(
            settings,
            engine=engine,
            embedder=OnnxMiniLmEmbedder(),
            extractor=SpacyExtractor(),
            executor=ThreadPoolExecutor(max_workers=1),
            publish_dead_letter=no_dlq,
        )
        lines = await asyncio.to_thread(lambda: events.read_bytes().splitlines())
        t0 = time.perf_counter()
        records = [RawRecord("eval", 0, i, None, raw) for i, raw in enumerate(lines)]
        for start in range(0, len(records), settings.indexer_batch_size):
            await handle_batch(deps, records[start : start + settings.indexer_batch_size])
        elapsed = time.perf_counter() - t0
        async with engine.connect() as conn:
            merges = (await conn.execute(text(MERGES))).all()
            candidates = (await conn.execute(text(CANDIDATES))).all()
            n_entities = await conn.scalar(text("SELECT count(*) FROM entities"))
            n_rel = await conn.scalar(text("SELECT count(*) FROM relationships"))
            n_mentions = await conn.scalar(text("SELECT count(*) FROM mentions"))
        await engine.dispose()
    finally:
        pg.stop()
        pg.purge()
    rng = random.Random(7)
    report = {
        "documents": len(lines),
        "seconds": round(elapsed, 1),
        "docs_per_s": round(len(lines) / elapsed, 2),
        "entities": n_entities,
        "relationships": n_rel,
        "mentions": n_mentions,
        "merged_aliases": len(merges),
        "candidate_duplicate_pairs": len(candidates),
        "merge_sample": [list(map(str, m)) for m in rng.sample(merges, min(sample, len(merges)))],
        "candidate_sample": [
            [str(c[0]), str(c[1]), str(c[2]), str(c[3]), round(float(c[4]), 2)]
            for c in rng.sample(candidates, min(sample, len(candidates)))
        ],
    }
    text_out = json.dumps(report, indent=1, ensure_ascii=False)
    if out:
        await asyncio.to_thread(out.write_text, text_out, encoding="utf-8")
    print(text_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("events", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--sample", type=int, default=40)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    asyncio.run(run(args.events, args.sample, args.out))


if __name__ == "__main__":
    main()
