"""Consolidation's band on a development graph, and consolidation with recorded adjudicator
answers (issue 21, deliverable 1; docs/curation.md, "Consolidation").

    .venv/bin/python bench/consolidation_band.py export --home DIR --corpus NAME --out band.jsonl
    .venv/bin/python bench/consolidation_band.py replay --home DIR --corpus NAME \\
        --answers bench/labels/consolidation_band.jsonl [--apply]

``export`` writes every pair in the band (a short name that is a longer one's last words,
compatible types, a shared document or relationship neighbour) with exactly what the LLM
adjudicator reads: both names and their first mentions' "title: sentence". ``replay`` runs
consolidation with the recorded answers (``same``) as its adjudicator, in the same order, makes
the merge curations, and with ``--apply`` resolves their documents again as the indexer would.
Then ``bench/entity_pairs.py measure`` and ``kgstream eval --keep`` give the figures after.
``--home`` is a kept ``kgstream eval --keep`` directory (started and stopped here): work on a
copy, the replay changes the graph.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.core.db.engine import UNBOUNDED, make_engine  # noqa: E402
from services.core.embedding import OnnxMiniLmEmbedder  # noqa: E402
from services.core.extraction import SpacyExtractor  # noqa: E402
from services.core.infra.postgres import EmbeddedPostgres  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.indexer.curation_apply import apply_pending  # noqa: E402
from services.indexer.deps import IndexerDeps  # noqa: E402
from services.maintenance.consolidation import consolidate, find  # noqa: E402


async def export(url: str, corpus: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []

    async def record(short: str, sc: str, long: str, lc: str, group: str) -> bool:
        rid = f"{corpus}-{len(rows):04d}"
        rows.append({"id": rid, "corpus": corpus, "short": short, "short_context": sc,
                     "long": long, "long_context": lc, "type": group})  # fmt: skip
        return False

    engine = make_engine(url, timeouts=UNBOUNDED)
    try:
        async with engine.connect() as conn:
            pairs = await find(conn, OnnxMiniLmEmbedder(), record)
    finally:
        await engine.dispose()
    print(f"{len(pairs)} candidate pairs, {len(rows)} in the band")
    return rows


async def replay(url: str, corpus: str, recorded: list[dict[str, Any]], apply: bool) -> None:
    asked = iter([r for r in recorded if r["corpus"] == corpus])

    async def answer(short: str, _sc: str, long: str, _lc: str, _group: str) -> bool:
        r = next(asked)
        if (r["short"], r["long"]) != (short, long):
            raise SystemExit(f"{r['id']}: the band moved ({short!r}/{long!r}); export again")
        return bool(r["same"])

    engine = make_engine(url, timeouts=UNBOUNDED)
    try:
        report = await consolidate(engine, OnnxMiniLmEmbedder(), adjudicate=answer)
        decisions = collections.Counter(p.decision for p in report.pairs)
        print(f"decisions {dict(decisions)}; {len(report.made)} curations made")
        if apply:

            async def no_dead_letters(_key: bytes | None, _value: bytes) -> None:
                raise RuntimeError("no dead letters here")

            deps = IndexerDeps.from_settings(
                Settings(),
                engine=engine,
                embedder=OnnxMiniLmEmbedder(),
                extractor=SpacyExtractor(),
                executor=ThreadPoolExecutor(1),
                publish_dead_letter=no_dead_letters,
            )
            started = time.monotonic()
            done = await apply_pending(deps)
            print(
                f"applied {done.curations} curations: {done.documents} documents resolved"
                f" again in {time.monotonic() - started:.1f}s"
            )
    finally:
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("export", "replay"):
        p = sub.add_parser(name)
        p.add_argument("--home", required=True)
        p.add_argument("--corpus", required=True)
        if name == "export":
            p.add_argument("--out", required=True, type=Path)
        else:
            p.add_argument("--answers", required=True, type=Path)
            p.add_argument("--apply", action="store_true")
    args = parser.parse_args()
    pg = EmbeddedPostgres(Path(args.home))
    url = pg.start()
    try:
        if args.command == "export":
            rows = asyncio.run(export(url, args.corpus))
            args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        else:
            recorded = [json.loads(line) for line in args.answers.read_text().splitlines()]
            asyncio.run(replay(url, args.corpus, recorded, args.apply))
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
