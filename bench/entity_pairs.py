"""Entity-linking figures against a labelled set of mention pairs (issue 21, deliverable 1).

A record is two mentions, each named by its document and surface, with a person's (or a
reviewer's) verdict: do they name the same real-world thing? ``sample`` draws records from a
graph for labelling; ``measure`` reads labelled records and says, for the graph as it is now,
how many labelled duplicates it keeps apart and how many labelled distinct pairs it merged.

    .venv/bin/python bench/entity_pairs.py sample --home DIR --corpus NAME --pairs 100 \\
        --merges 60 --out records.jsonl        # unlabelled, for review
    .venv/bin/python bench/entity_pairs.py measure --home DIR --corpus NAME \\
        --labels bench/labels/entity_pairs.jsonl [--json]

Records of two kinds are drawn (seeded):
- ``candidate``: two entities the graph keeps apart that a person would suspect are one (the
  resolver's own candidate rule: compatible type groups, and trigram similarity >= 0.5 or one
  name a whole-word prefix or suffix of the other; bench/eval_resolution.py);
- ``merged``: an alias the graph merged into an entity whose key differs from it, against the
  entity's own name.

Each side carries up to two of its mentions' sentences with their document titles, the context
a reviewer reads. ``--home`` is an embedded PostgreSQL home (a kept ``kgstream eval --keep``
directory: it is started and stopped), ``--database-url`` any database.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.core.infra.postgres import EmbeddedPostgres  # noqa: E402

CANDIDATES = """
SELECT a.id, b.id FROM entities a JOIN entities b ON a.id < b.id
WHERE (a.type_group = b.type_group OR 'ANY' IN (a.type_group, b.type_group))
  AND (similarity(a.name, b.name) >= 0.5
       OR b.key LIKE '% ' || a.key OR a.key LIKE '% ' || b.key
       OR b.key LIKE a.key || ' %' OR a.key LIKE b.key || ' %')
ORDER BY a.id, b.id
"""
MERGED = """
SELECT e.id, a.alias FROM aliases a JOIN entities e ON e.id = a.entity_id
WHERE a.alias_key <> e.key ORDER BY e.id, a.alias
"""
# Up to two mentions of an entity (optionally with one surface), with their sentence and title.
CONTEXTS = """
SELECT m.doc_id, m.surface, m.sentence, d.title FROM mentions m
JOIN documents d ON d.doc_id = m.doc_id
WHERE m.entity_id = %(e)s AND (%(surface)s::text IS NULL OR m.surface = %(surface)s)
  AND m.start_char >= 0
ORDER BY m.doc_id, m.start_char LIMIT 2
"""
ENTITY = "SELECT name, type FROM entities WHERE id = %(e)s"
# The entity a (document, surface) mention belongs to now.
OWNER = """
SELECT entity_id FROM mentions WHERE doc_id = %(d)s AND surface = %(s)s AND start_char >= 0
ORDER BY start_char LIMIT 1
"""


@contextmanager
def connect(args: argparse.Namespace) -> Iterator[psycopg.Connection[Any]]:
    pg = None
    url = args.database_url
    if url is None:
        pg = EmbeddedPostgres(Path(args.home))
        url = pg.start()
    try:
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
            yield conn
    finally:
        if pg is not None:
            pg.stop()


def _side(conn: psycopg.Connection[Any], entity: int, surface: str | None) -> dict[str, Any]:
    name, etype = conn.execute(ENTITY, {"e": entity}).fetchone() or ("", "")
    rows = conn.execute(CONTEXTS, {"e": entity, "surface": surface}).fetchall()
    contexts = [{"doc_id": d, "title": t, "surface": s, "sentence": x[:400]} for d, s, x, t in rows]
    return {"entity": name, "type": etype, "contexts": contexts}


def sample(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    out: list[dict[str, Any]] = []
    with connect(args) as conn:
        pairs = conn.execute(CANDIDATES).fetchall()
        for a, b in rng.sample(pairs, min(args.pairs, len(pairs))):
            left, right = _side(conn, a, None), _side(conn, b, None)
            if left["contexts"] and right["contexts"]:
                out.append({"kind": "candidate", "a": left, "b": right})
        merged = conn.execute(MERGED).fetchall()
        for entity, alias in rng.sample(merged, min(args.merges, len(merged))):
            left, right = _side(conn, entity, None), _side(conn, entity, alias)
            own = [c for c in left["contexts"] if c["surface"] != alias]
            if own and right["contexts"]:
                out.append({"kind": "merged", "a": {**left, "contexts": own}, "b": right})
        print(f"{len(pairs)} candidate pairs, {len(merged)} merged aliases", file=sys.stderr)
    with Path(args.out).open("w", encoding="utf-8") as fh:
        for i, record in enumerate(out):
            named = {"id": f"{args.corpus}-{i:03d}", "corpus": args.corpus, **record}
            fh.write(json.dumps(named, ensure_ascii=False) + "\n")
    print(f"wrote {len(out)} records to {args.out}", file=sys.stderr)


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _owner(conn: psycopg.Connection[Any], side: dict[str, Any]) -> int | None:
    for context in side["contexts"]:
        row = conn.execute(OWNER, {"d": context["doc_id"], "s": context["surface"]}).fetchone()
        if row:
            return int(row[0])
    return None


def measure(args: argparse.Namespace) -> None:
    """Per kind of record (they are drawn from different populations, so they are not mixed):
    of the candidate pairs, the labelled duplicates the graph keeps apart (its duplicate rate)
    and the labelled distinct pairs it has merged since (false merges a consolidation made); of
    the merged aliases, the labelled distinct pairs still merged (its false-merge rate) and the
    labelled duplicates split since."""
    records = [json.loads(line) for line in Path(args.labels).read_text().splitlines() if line]
    mine = [r for r in records if r["corpus"] == args.corpus and r.get("label") in SAME_OR_NOT]
    counts: dict[str, dict[str, int]] = {
        kind: {"same": 0, "same_apart": 0, "different": 0, "different_merged": 0, "missing": 0}
        for kind in ("candidate", "merged")
    }
    with connect(args) as conn:
        for record in mine:
            tally = counts[record["kind"]]
            a, b = _owner(conn, record["a"]), _owner(conn, record["b"])
            if a is None or b is None:
                tally["missing"] += 1
            elif record["label"] == "same":
                tally["same"] += 1
                tally["same_apart"] += a != b
            else:
                tally["different"] += 1
                tally["different_merged"] += a == b
    pairs, merges = counts["candidate"], counts["merged"]
    decided = {kind: c["same"] + c["different"] for kind, c in counts.items()}
    report = {
        "corpus": args.corpus,
        "counts": counts,
        "duplicate_rate": _rate(pairs["same_apart"], decided["candidate"]),
        "false_merge_rate": _rate(merges["different_merged"], decided["merged"]),
        "merges_made_of_distinct_pairs": _rate(pairs["different_merged"], decided["candidate"]),
        "true_merges_undone": _rate(merges["same_apart"], decided["merged"]),
    }
    print(json.dumps(report, indent=None if args.json else 1))


SAME_OR_NOT = ("same", "different")


def _rate(hits: int, n: int) -> dict[str, Any]:
    low, high = wilson(hits, n)
    return {"share": round(hits / n, 3) if n else None, "ci95": [round(low, 3), round(high, 3)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("sample", "measure"):
        p = sub.add_parser(name)
        where = p.add_mutually_exclusive_group(required=True)
        where.add_argument("--home")
        where.add_argument("--database-url")
        p.add_argument("--corpus", required=True)
        if name == "sample":
            p.add_argument("--pairs", type=int, default=100)
            p.add_argument("--merges", type=int, default=60)
            p.add_argument("--seed", type=int, default=21)
            p.add_argument("--out", required=True)
        else:
            p.add_argument("--labels", required=True)
            p.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sample(args) if args.command == "sample" else measure(args)


if __name__ == "__main__":
    main()
