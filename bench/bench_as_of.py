"""What ``as_of`` costs (issue 31, step 4): vector mode as of a past time against the same
query now, on a bulk-built database (bench/bulk_build.py) after bench/bench_filters.py has
given its documents an ``occurred_at`` in 2023:

    flock /tmp/kg-heavy.lock .venv/bin/python bench/bench_as_of.py \
        --home /var/tmp/kg-bulk-38k --documents 38000 [--replaced 0.1] [--questions 40] [--out F]

Starts the home's PostgreSQL, migrates it (alembic 0025), and gives it a history as the indexer
would have kept it: a share (``--replaced``) of the documents, chosen by a hash of the doc_id,
had an earlier version from 2022 until their current one occurred (their chunks, under new ids,
in ``chunk_history``; their row in ``document_versions``; their current chunks born then). The
history is marked complete from the beginning (``history_horizon``). Then, per caller (the
operator, and the anonymous restricted caller API users get), the generated questions in
vector mode: now, as of 2023-07-01 (half the replaced documents in their old version) and as of
2024-01-01 (every document current, read through the past state). The median of ``--runs``
passes of each percentile. Retrieval quality means nothing here (random vectors).
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_scale import query_service  # noqa: E402
from query_timing import home_arguments, median_row, run_on_home, timed_pass  # noqa: E402
from sqlalchemy import text  # noqa: E402

from services.core.access import Caller  # noqa: E402
from services.core.db.engine import make_engine  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.retrieval.schemas import QueryRequest  # noqa: E402

CALLERS = {"operator": Caller.operator(), "restricted": Caller()}
TIMES: dict[str, datetime | None] = {
    "now": None,
    "as of 2023-07-01": datetime(2023, 7, 1, tzinfo=UTC),
    "as of 2024-01-01": datetime(2024, 1, 1, tzinfo=UTC),
}
OFFSET = 10**12  # history ids, past any chunk id the build drew
_REPLACED = "abs(hashtext(d.doc_id || '/v')) % 1000 < :share"
HISTORY = (
    "DELETE FROM chunk_history",
    "DELETE FROM document_versions",
    "UPDATE chunks SET born_at = '-infinity' WHERE born_at <> '-infinity'",
    "INSERT INTO document_versions (doc_id, tenant, title, version, metadata, acl, valid_from,"  # noqa: S608 - constants
    " valid_to) SELECT d.doc_id, d.tenant, d.title, d.version, d.metadata, d.acl,"
    f" timestamptz '2022-01-01 00:00+00', d.occurred_at FROM documents d WHERE {_REPLACED}",
    "INSERT INTO chunk_history (id, doc_id, ord, text, embedding, valid_from, valid_to)"  # noqa: S608 - constants
    f" SELECT c.id + {OFFSET}, c.doc_id, c.ord, c.text, c.embedding,"
    " timestamptz '2022-01-01 00:00+00', d.occurred_at FROM chunks c JOIN documents d"
    f" USING (doc_id) WHERE {_REPLACED}",
    f"UPDATE chunks c SET born_at = d.occurred_at FROM documents d WHERE d.doc_id = c.doc_id"  # noqa: S608 - constants
    f" AND {_REPLACED}",
    "UPDATE history_horizon SET kept_since = '-infinity'",
)


async def _prepare(url: str, share: float) -> dict[str, Any]:
    engine = make_engine(url)
    try:
        t0 = time.perf_counter()
        async with engine.begin() as conn:
            for statement in HISTORY:
                await conn.execute(text(statement), {"share": int(share * 1000)})
        async with engine.begin() as conn:
            for table in ("chunks", "chunk_history", "document_versions", "documents"):
                await conn.execute(text(f"ANALYZE {table}"))
            counts = (
                await conn.execute(
                    text(
                        "SELECT (SELECT count(*) FROM chunks), (SELECT count(*) FROM"
                        " chunk_history), (SELECT count(*) FROM document_versions),"
                        " (SELECT count(*) FROM entities)"
                    )
                )
            ).one()
        return {
            "history_s": round(time.perf_counter() - t0, 1),
            "chunks": counts[0],
            "chunk_history": counts[1],
            "document_versions": counts[2],
            "entities": counts[3],
        }
    finally:
        await engine.dispose()


async def _measure(url: str, asked: list[dict[str, Any]], runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with query_service(Settings(), url) as (service, _):
        for who, caller in CALLERS.items():
            for name, as_of in TIMES.items():
                requests = [
                    QueryRequest(
                        question=q["question"], mode="vector", k=20, explain=False, as_of=as_of
                    )
                    for q in asked
                ]
                passes = [await timed_pass(service, requests, caller) for _ in range(runs)]
                row = median_row(passes, out.get(f"{who}.now"))
                out[f"{who}.{name}"] = row
                print(f"{who:<10} {name:<18} {row}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = home_arguments(__doc__ or "")
    parser.add_argument("--replaced", type=float, default=0.1, help="share with a past version")
    parser.add_argument("--questions", type=int, default=40)
    args = parser.parse_args()
    report: dict[str, Any] = {"documents": args.documents, "replaced": args.replaced}
    run_on_home(
        args,
        report,
        lambda url: _prepare(url, args.replaced),
        lambda url, asked: _measure(url, asked, args.runs),
    )


if __name__ == "__main__":
    main()
