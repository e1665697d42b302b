"""What a query's filters cost (issue 31: a filtered query at most 1.2x an unfiltered one at
105k entities), on a bulk-built database (bench/bulk_build.py):

    .venv/bin/python bench/bulk_build.py --documents 38000 --home /var/tmp/kg-bulk-38k
    flock /tmp/kg-heavy.lock .venv/bin/python bench/bench_filters.py \
        --home /var/tmp/kg-bulk-38k --documents 38000 [--runs 3] [--questions 60] [--out F]

Starts the home's PostgreSQL (shared_buffers 25% of RAM, as issue 20 measured), migrates it,
recomputes the communities once when none is published (extractive reports, hashed vectors:
global mode has communities to rank), then gives every document a synthetic ``source`` (one of
8, by a hash of its doc_id) and an ``occurred_at`` in 2023 (one day of 365, by another hash),
ANALYZEs, and measures per mode (vector, local, global) and caller (the operator, and the
anonymous restricted caller API users get) the generated questions without filters and with
each filter below: ``--runs`` passes, the median of each percentile, and the ratio of the
filtered p50 to the unfiltered one. Retrieval quality means nothing here (random vectors).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_scale import query_service, recompute_once  # noqa: E402
from bulk_rows import HashedEmbedder  # noqa: E402
from query_timing import home_arguments, median_row, run_on_home, timed_pass  # noqa: E402
from sqlalchemy import text  # noqa: E402

from services.core.access import Caller  # noqa: E402
from services.core.db.engine import make_engine  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.retrieval.schemas import QueryRequest  # noqa: E402

MODES = ("vector", "local", "global")
CALLERS = {"operator": Caller.operator(), "restricted": Caller()}
SOURCES = [f"source-{i}" for i in range(8)]
FILTERS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "source (1 of 8)": {"metadata": {"source": "source-3"}},
    "two sources": {"metadata": {"source": ["source-1", "source-5"]}},
    "a month of occurred_at": {"occurred_at": {"gte": "2023-06-01", "lt": "2023-07-01"}},
    "source and a quarter": {
        "metadata": {"source": "source-3"},
        "occurred_at": {"gte": "2023-04-01", "lt": "2023-07-01"},
    },
}
DESCRIBE = text(
    "UPDATE documents SET metadata = metadata || jsonb_build_object('source',"
    " 'source-' || (abs(hashtext(doc_id)) % 8)),"
    " occurred_at = timestamptz '2023-01-01 00:00+00'"
    " + (abs(hashtext(doc_id || '/t')) % 365) * interval '1 day'"
)


async def _prepare(url: str, seed: int) -> dict[str, Any]:
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            published = await conn.scalar(
                text("SELECT count(*) FROM snapshots WHERE status = 'published'")
            )
        recomputed = None
        if not published:
            settings = Settings(community_reports="extractive")
            recomputed = await recompute_once(
                settings, url, HashedEmbedder(settings.embedding_dim, seed)
            )
        t0 = time.perf_counter()
        async with engine.begin() as conn:
            await conn.execute(DESCRIBE)
        async with engine.begin() as conn:
            await conn.execute(text("ANALYZE documents"))
            shares = (
                await conn.execute(
                    text(
                        "SELECT metadata->>'source', count(*) FROM documents GROUP BY 1 ORDER BY 1"
                    )
                )
            ).all()
        return {
            "recompute": recomputed,
            "describe_s": round(time.perf_counter() - t0, 2),
            "sources": {str(s): int(n) for s, n in shares},
        }
    finally:
        await engine.dispose()


def _requests(asked: list[dict[str, Any]], mode: str, filters: Any) -> list[QueryRequest]:
    return [
        QueryRequest(question=q["question"], mode=mode, k=20, explain=False, filters=filters)
        for q in asked
    ]


async def _measure(url: str, asked: list[dict[str, Any]], runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with query_service(Settings(), url) as (service, _):
        for who, caller in CALLERS.items():
            for mode in MODES:
                for name, filters in FILTERS.items():
                    requests = _requests(asked, mode, filters)
                    passes = [await timed_pass(service, requests, caller) for _ in range(runs)]
                    row = median_row(passes, out.get(f"{who}.{mode}.none"))
                    out[f"{who}.{mode}.{name}"] = row
                    print(f"{who:<10} {mode:<7} {name:<24} {row}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = home_arguments(__doc__ or "")
    parser.add_argument("--questions", type=int, default=60)
    args = parser.parse_args()
    report: dict[str, Any] = {"documents": args.documents, "filters": FILTERS}
    run_on_home(
        args,
        report,
        lambda url: _prepare(url, args.seed),
        lambda url, asked: _measure(url, asked, args.runs),
    )


if __name__ == "__main__":
    main()
