"""Entity-linking figures against a labelled set of mention pairs (issue 21, deliverable 1).

A record is two mentions, each named by its document and surface, with a person's (or a
reviewer's) verdict: do they name the same real-world thing? ``sample`` draws records from a
graph for labelling; ``measure`` reads labelled records and says, for the graph as it is now,
how many labelled duplicates it keeps apart and how many labelled distinct pairs it merged.

    .venv/bin/python bench/entity_pairs.py sample --home DIR --corpus NAME --pairs 100 \\
        --merges 60 --out records.jsonl        # unlabelled, for review
    .venv/bin/python bench/entity_pairs.py measure --home DIR --corpus NAME \\
        --labels bench/labels/entity_pairs.jsonl [--json]

The drawing and the scoring are the service's own (services/maintenance/review.py, also
behind `kgstream review sample` and `kgstream review score`): candidate pairs the graph keeps
apart and aliases it merged, each side with up to two mentions' sentences and titles; scored
per kind. ``--home`` is an embedded PostgreSQL home (a kept ``kgstream eval --keep``
directory: it is started and stopped), ``--database-url`` any database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.core.db.engine import UNBOUNDED, make_engine  # noqa: E402
from services.core.infra.postgres import EmbeddedPostgres  # noqa: E402
from services.maintenance import review  # noqa: E402

T = TypeVar("T")


@contextmanager
def connect(args: argparse.Namespace) -> Iterator[str]:
    """The database URL (an embedded home is started, and stopped after)."""
    pg = None
    url = args.database_url
    if url is None:
        pg = EmbeddedPostgres(Path(args.home))
        url = pg.start()
    try:
        yield url
    finally:
        if pg is not None:
            pg.stop()


def sample(args: argparse.Namespace) -> None:
    with connect(args) as url:
        items = asyncio.run(_on(url, lambda conn: review.sample(
            conn, candidates=args.pairs, merges=args.merges, seed=args.seed
        )))  # fmt: skip
    with Path(args.out).open("w", encoding="utf-8") as fh:
        for i, item in enumerate(items):
            named = {"id": f"{args.corpus}-{i:03d}", "corpus": args.corpus, **item}
            fh.write(json.dumps(named, ensure_ascii=False) + "\n")
    print(f"wrote {len(items)} records to {args.out}", file=sys.stderr)


def measure(args: argparse.Namespace) -> None:
    """The corpus's records scored against the graph (review.score: per kind, not mixed)."""
    lines = Path(args.labels).read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    mine = [r for r in records if r.get("corpus") == args.corpus]
    with connect(args) as url:
        report = asyncio.run(_on(url, lambda conn: review.score(conn, mine)))
    print(json.dumps({"corpus": args.corpus, **report}, indent=None if args.json else 1))


async def _on(url: str, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    engine = make_engine(url, timeouts=UNBOUNDED)
    try:
        async with engine.connect() as conn:
            return await work(conn)
    finally:
        await engine.dispose()


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
