"""Does the bulk builder (bench/bulk_build.py) write what the indexer writes? Ingest a small
synthetic corpus through a real `kgstream worker indexer` (spaCy NER, the embedding model,
entity resolution), bulk-build the same corpus into a second database on the same server, and
compare rows per table and the distributions the query paths feel: entities per document,
mentions per entity, evidence per relationship, chunks per document, entity types.

    .venv/bin/python bench/bulk_compare.py [--documents 500] [--seed 7] [--out compare.json]

Prints a table (stderr) and JSON (stdout).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _scale_harness import indexer_stack, wait_for  # noqa: E402
from bulk_build import GRAPH_TABLES, build, plain  # noqa: E402
from synth_corpus import Corpus  # noqa: E402

from services.core.db import migrations  # noqa: E402
from services.core.settings import Settings  # noqa: E402

PERCENTILES = (0.5, 0.9, 0.99)
# Each distribution: SQL giving one number per item.
DISTRIBUTIONS = {
    "entities_per_document": "SELECT count(DISTINCT entity_id) FROM mentions GROUP BY doc_id",
    "mentions_per_entity": "SELECT mention_count FROM entities",
    "evidence_per_relationship": "SELECT evidence_count FROM relationships",
    "chunks_per_document": "SELECT count(*) FROM chunks GROUP BY doc_id",
    "mentions_per_chunk": "SELECT count(*) FROM mentions GROUP BY chunk_id",
}


def _at(values: list[int], q: float) -> int:
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0


def describe(url: str) -> dict[str, Any]:
    """Rows and bytes per graph table, the distributions, entity types and the max."""
    out: dict[str, Any] = {"rows": {}, "bytes": {}, "distributions": {}}
    with psycopg.connect(plain(url)) as conn:
        for table in GRAPH_TABLES:
            out["rows"][table] = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]  # noqa: S608 - constants
            out["bytes"][table] = conn.execute(
                "SELECT pg_total_relation_size(%s)", (table,)
            ).fetchone()[0]  # type: ignore[index]
        for name, sql in DISTRIBUTIONS.items():
            values = sorted(int(r[0]) for r in conn.execute(sql).fetchall())
            out["distributions"][name] = {
                "mean": round(sum(values) / max(len(values), 1), 2),
                **{f"p{round(q * 100)}": _at(values, q) for q in PERCENTILES},
                "max": values[-1] if values else 0,
            }
        types = conn.execute("SELECT type, count(*) FROM entities GROUP BY 1 ORDER BY 2 DESC")
        out["entity_types"] = dict(types.fetchall())
    return out


def compare(documents: int, seed: int) -> dict[str, Any]:
    """The real ingest and the bulk build of one corpus, described the same way."""
    events = list(Corpus(documents, seed).events())
    settings = Settings()
    with indexer_stack() as stack:
        stack.publish(events)
        wait_for(stack.url, len(events), 3600)
        stack.stop_worker()
        ingested = describe(stack.url)
        bulk_url = stack.url.rsplit("/", 1)[0] + "/kgbulk"
        with psycopg.connect(plain(stack.url), autocommit=True) as conn:
            conn.execute("CREATE DATABASE kgbulk")
        migrations.upgrade(bulk_url, settings.embedding_dim)
        built = build(bulk_url, documents, seed, settings)
        bulk = describe(bulk_url)
    return {"documents": documents, "seed": seed, "ingest": ingested, "bulk": bulk,
            "build": built}  # fmt: skip


def table(report: dict[str, Any]) -> str:
    """Ingest, bulk and bulk / ingest per figure."""
    lines = [f"{'':<34}{'ingest':>10}{'bulk':>10}{'ratio':>8}"]

    def line(label: str, a: float, b: float) -> None:
        ratio = f"{b / a:.3f}" if a else "-"
        lines.append(f"{label:<34}{a:>10}{b:>10}{ratio:>8}")

    ing, bulk = report["ingest"], report["bulk"]
    for t in GRAPH_TABLES:
        line(f"{t} rows", ing["rows"][t], bulk["rows"][t])
    for t in GRAPH_TABLES:
        line(f"{t} KiB", ing["bytes"][t] // 1024, bulk["bytes"][t] // 1024)
    for name, stats in ing["distributions"].items():
        for k, v in stats.items():
            line(f"{name} {k}", v, bulk["distributions"][name][k])
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report = compare(args.documents, args.seed)
    print(table(report), file=sys.stderr)
    text = json.dumps(report, indent=1)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
