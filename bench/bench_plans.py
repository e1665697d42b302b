"""What a typed graph plan costs (issue 33: a plan of depth <= 3 over the 1M-entity bulk-built
database answers in p50 <= 100 ms), on a bulk-built home (bench/bulk_build.py):

    flock /tmp/kg-heavy.lock .venv/bin/python bench/bench_plans.py \\
        --home /var/tmp/kg-bulk-1m [--runs 3] [--plans 60] [--hide-share 0.5] [--held] [--out F]

Starts the home's PostgreSQL (shared_buffers 25% of RAM), migrates it, draws ``--plans``
start entities (seeded; entities with 2 to 200 mentions: named things, not the hubs a plan
would be refused on) and a second one each, and times each plan shape below through the
engine (plan_exec.execute in a read transaction, as POST /v1/graph/query runs it), as the
operator and as the anonymous caller (with ``--hide-share``: half the documents hidden from
it, so every read is the filtered one): ``--runs`` passes, the median of p50 and p99, and how
many plans were refused (too broad, too long). With ``--held``, the steps walk the graph held
in memory (graph_memory.build, after the ACLs are set), as the query API's do. The bulk graph's
relationships are co-occurrences only, so plans follow any type.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from query_timing import percentile, started_home, write_report  # noqa: E402
from sqlalchemy import text  # noqa: E402

from services.core.access import Caller  # noqa: E402
from services.core.db.engine import UNBOUNDED, make_engine  # noqa: E402
from services.retrieval import graph_memory  # noqa: E402
from services.retrieval.errors import Invalid  # noqa: E402
from services.retrieval.graph_memory import MemoryGraph  # noqa: E402
from services.retrieval.plan_exec import execute  # noqa: E402
from services.retrieval.plans import Plan  # noqa: E402
from services.retrieval.visibility import widened  # noqa: E402

BUDGET_S = 5.0  # KGSTREAM_QUERY_PLAN_TIMEOUT_S's default
_NAMED = text(
    "SELECT name FROM entities WHERE mention_count BETWEEN 2 AND 200"
    " ORDER BY md5(id::text || :seed) LIMIT :n"
)


def shapes(a: str, b: str) -> dict[str, dict[str, Any]]:
    """The plan shapes timed, from start entity ``a`` (and ``b``)."""
    start = {"names": [a]}
    return {
        "count, 1 hop": {
            "start": start,
            "follow": [{"direction": "both"}],
            "result": {"op": "count"},
        },
        "list, 2 hops, a type kept": {
            "start": start,
            "follow": [{"direction": "both", "depth": 2}],
            "where": {"types": ["ORG"]},
            "result": {"op": "list", "limit": 50},
        },
        "impact, 3 hops out": {
            "start": start,
            "follow": [{"direction": "out", "depth": 3}],
            "result": {"op": "list", "limit": 50},
        },
        "rank by degree, 1 hop": {
            "start": start,
            "follow": [{"direction": "both"}],
            "result": {"op": "rank", "related": {"direction": "both"}, "limit": 10},
        },
        "group by type, 2 hops": {
            "start": start,
            "follow": [{"direction": "both", "depth": 2}],
            "result": {"op": "group"},
        },
        "negation, 1 hop": {
            "start": start,
            "follow": [{"direction": "both"}],
            "exclude": {"names": [b]},
            "result": {"op": "list", "limit": 50},
        },
        "compare": {"start": {"names": [a, b]}, "result": {"op": "compare"}},
    }


async def _pass(
    url: str, plans: list[Plan], caller: Caller, memory: MemoryGraph | None
) -> dict[str, Any]:
    engine = make_engine(url, timeouts=UNBOUNDED)
    ms: list[float] = []
    refused = 0
    reached: list[int] = []
    try:
        for plan in plans:
            t0 = time.perf_counter()
            try:  # a refused plan (too broad, too long) leaves its transaction to roll back
                async with engine.connect() as conn, conn.begin():
                    await conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
                    reader = await widened(conn, caller)
                    answer = await execute(
                        conn, plan, reader, snapshot_id=None, budget_s=BUDGET_S, memory=memory
                    )
                    reached.append(answer.count)
            except Invalid:
                refused += 1
            ms.append((time.perf_counter() - t0) * 1000)
    finally:
        await engine.dispose()
    return {
        "p50_ms": round(percentile(ms, 0.5), 1),
        "p99_ms": round(percentile(ms, 0.99), 1),
        "refused": refused,
        "median_count": statistics.median(reached) if reached else 0,
    }


async def _measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    engine = make_engine(url, timeouts=UNBOUNDED)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(_NAMED, {"seed": str(args.seed), "n": 2 * args.plans})
            names = [str(r[0]) for r in rows.all()]
    finally:
        await engine.dispose()
    memory = None
    if args.held:  # as the query API holds it (graph_holder.py), after the ACLs were set
        t0 = time.perf_counter()
        memory = await graph_memory.build(make_engine(url, timeouts=UNBOUNDED))
        print(f"held graph built in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    rng = random.Random(args.seed)
    pairs = [(names[i], names[-1 - i]) for i in range(args.plans)]
    rng.shuffle(pairs)
    callers = {"operator": Caller.operator(), "anonymous": Caller()}
    out: dict[str, Any] = {}
    for shape in shapes("a", "b"):
        plans = [Plan.model_validate(shapes(a, b)[shape]) for a, b in pairs]
        for who, caller in callers.items():
            await _pass(url, plans[:5], caller, memory)  # warm-up
            passes = [await _pass(url, plans, caller, memory) for _ in range(args.runs)]
            row = {
                "p50_ms": round(statistics.median(p["p50_ms"] for p in passes), 1),
                "p99_ms": round(statistics.median(p["p99_ms"] for p in passes), 1),
                "refused": passes[0]["refused"],
                "median_count": passes[0]["median_count"],
            }
            out[f"{who}.{shape}"] = row
            print(f"{who:<10} {shape:<28} {row}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", maxsplit=1)[0])
    parser.add_argument("--home", type=Path, required=True, help="a bulk-built home")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--plans", type=int, default=60)
    parser.add_argument("--hide-share", type=float, default=0.0)
    parser.add_argument(
        "--held", action="store_true", help="steps walk the held graph, as the query API's do"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report: dict[str, Any] = {"home": str(args.home), "plans": args.plans, "runs": args.runs}
    with started_home(args.home, report, args.hide_share) as url:
        report["queries"] = asyncio.run(_measure(url, args))
    write_report(report, args.out)


if __name__ == "__main__":
    main()
