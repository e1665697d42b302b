"""Scale on a seeded synthetic corpus (bench/synth_corpus.py): ingest rate, database size by
table, resident memory of each process, recompute time and query latency per mode, per size.

    .venv/bin/python bench/bench_scale.py [--sizes 1000,10000] [--seed 7] [--questions 100]
        [--quick] [--out report.json]

For each size: generate the corpus, start an embedded PostgreSQL and tansu broker in a
temporary home and one real `kgstream worker indexer` process (bench/_scale_harness.py),
publish every event, time publish -> all applied (one run: an ingest rate, not a median) while
sampling the memory of the indexer (VmRSS), PostgreSQL (PSS of all its processes) and the
broker every second; stop the worker; run one recompute of the community engine in-process
(extractive reports: no LLM); count rows and bytes by table; then ask the generated questions
(two entities of a document each) in every mode through an in-process QueryService, after one
untimed warm-up query per mode (services/eval/runner.run_questions, as bench/bench_query.py),
and one more pass in local and in vector mode timing every SQL statement, with plans of the
costliest (bench/_statement_profile.py).
``--quick`` runs one size of 200 documents. Prints a table to stderr and JSON to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _scale_harness import MemorySampler, Stack, indexer_stack, table_sizes, wait_for  # noqa: E402
from _statement_profile import profile_mode  # noqa: E402
from synth_corpus import Corpus, questions  # noqa: E402

from services.communities.app import build_deps  # noqa: E402
from services.communities.recompute import recompute  # noqa: E402
from services.core.db.engine import UNBOUNDED, make_engine  # noqa: E402
from services.core.embedding import Embedder  # noqa: E402
from services.core.llm.client import process_client  # noqa: E402
from services.core.models import build_embedder, build_extractor  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.eval.metrics import summarise  # noqa: E402
from services.eval.runner import MODES, run_questions  # noqa: E402
from services.retrieval.compose import graph_holder  # noqa: E402
from services.retrieval.service import (  # noqa: E402
    QUERY_CPU_WORKERS,
    QueryService,
    build_query_service,
)

QUICK_SIZE = 200
PROFILED = ("local", "vector", "global")  # the modes with latency targets the runs missed
GRAPH_TABLES = ("documents", "chunks", "entities", "relationships", "mentions")


def _progress(total: int, t0: float) -> Any:
    last = [time.perf_counter()]

    def report(done: int) -> None:
        now = time.perf_counter()
        if now - last[0] >= 60:
            last[0] = now
            rate = done / (now - t0)
            print(f"  {done}/{total} applied, {rate:.1f} docs/s", file=sys.stderr, flush=True)

    return report


def ingest(stack: Stack, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Publish the events and time publish -> all applied, sampling memory throughout."""
    stack.warm_up(events[0])
    postmaster, broker = stack.pg.pid(), stack.broker.pid
    with MemorySampler(stack.worker.pid, postmaster, broker) as memory:
        t0 = time.perf_counter()
        stack.publish(events)
        published = time.perf_counter()
        done = wait_for(stack.url, len(events) + 1, 6 * 3600, _progress(len(events), t0))
    return {
        "publish_s": round(published - t0, 2),
        "seconds": round(done - t0, 2),
        "docs_per_s": round(len(events) / (done - t0), 2),
        "memory": memory.summary(),
    }


async def recompute_once(
    settings: Settings, url: str, embedder: Embedder | None = None
) -> dict[str, Any]:
    """One in-process recompute (extractive reports), timed, with its stage timings;
    ``embedder`` replaces the configured one for the report vectors."""
    deps = build_deps(settings, url)
    if embedder is not None:
        deps = dataclasses.replace(deps, embedder=embedder)
    try:
        t0 = time.perf_counter()
        result = await recompute(deps, "requested")
        seconds = time.perf_counter() - t0
    finally:
        await deps.engine.dispose()
    published = result.snapshot
    return {
        "seconds": round(seconds, 2),
        "reports": settings.community_reports,
        "nodes": published.nodes,
        "edges": published.edges,
        "communities": published.communities,
        "levels": published.levels,
        "timings": {k: round(v, 2) for k, v in result.timings.items()},
    }


async def latencies(
    settings: Settings, url: str, asked: list[dict[str, Any]], k: int = 10
) -> dict[str, Any]:
    """Every question in every mode: p50/p99 latency and retrieval by doc_id; then where the
    time of the PROFILED modes goes (another pass each, every statement timed, outside the
    figures)."""
    out: dict[str, Any] = {}
    async with query_service(settings, url) as (service, engine):
        for mode in MODES:
            results = await run_questions(service, asked, mode, k, progress=False)
            out[mode] = summarise(results, k)
        for mode in PROFILED:
            try:
                out[f"{mode}_profile"] = await profile_mode(service, engine, asked, mode)
            except Exception as exc:  # noqa: BLE001 - the profile must not lose the figures
                out[f"{mode}_profile"] = {"failed": f"{type(exc).__name__}: {exc}"[:500]}
    return out


@contextlib.asynccontextmanager
async def query_service(
    settings: Settings, url: str
) -> AsyncIterator[tuple[QueryService, AsyncEngine]]:
    """An in-process QueryService as the API builds it (its two model threads, the offline
    models, the held graph when KGSTREAM_QUERY_GRAPH_MEMORY is on: built before the first
    query), on an engine without statement timeouts; disposed on exit."""
    engine = make_engine(url, timeouts=UNBOUNDED)
    client = process_client(settings)
    embedder, extractor = build_embedder(settings, client), build_extractor(settings, client)
    graph = graph_holder(settings, url) if settings.query_graph_memory else None
    try:
        if graph is not None:
            await graph.caught_up()
        with ThreadPoolExecutor(max_workers=QUERY_CPU_WORKERS) as pool:  # the API's
            yield (
                build_query_service(
                    settings, engine, embedder, extractor, pool, client=client, graph=graph
                ),
                engine,
            )
    finally:
        if graph is not None:
            graph.close()
        await engine.dispose()


def one_size(size: int, seed: int, n_questions: int) -> dict[str, Any]:
    """Generate, ingest, measure, recompute and query one corpus size."""
    corpus = Corpus(size, seed)
    events = list(corpus.events())
    asked = questions(events, n_questions, seed)
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    settings = Settings(community_reports="extractive")
    with indexer_stack() as stack:
        print(f"size {size}: ingesting", file=sys.stderr, flush=True)
        ingested = ingest(stack, events)
        stack.stop_worker()
        print(f"size {size}: recompute", file=sys.stderr, flush=True)
        rebuilt = asyncio.run(recompute_once(settings, stack.url))
        tables = table_sizes(stack.url)  # after the recompute: communities included
        print(f"size {size}: queries", file=sys.stderr, flush=True)
        modes = asyncio.run(latencies(settings, stack.url, asked))
    return {
        "documents": size,
        "corpus": corpus.stats.to_json(),
        "ingest": ingested,
        "tables": tables,
        "database_bytes": sum(t["bytes"] for t in tables.values()),
        "recompute": rebuilt,
        "queries": modes,
        "loadavg_before_after": [load_before, Path("/proc/loadavg").read_text().split()[:3]],
    }


def table(reports: list[dict[str, Any]]) -> str:
    """The figures side by side, one column per size."""
    rows: list[tuple[str, Any]] = []

    def col(get: Any) -> list[str]:
        return [str(get(r)) for r in reports]

    rows.append(("documents", col(lambda r: r["documents"])))
    for name in GRAPH_TABLES:
        rows.append((f"{name} rows", col(lambda r, n=name: r["tables"].get(n, {}).get("rows"))))
    rows.append(("ingest docs/s", col(lambda r: r["ingest"]["docs_per_s"])))
    rows.append(("database MiB", col(lambda r: round(r["database_bytes"] / 2**20, 1))))
    for proc in ("indexer_rss_mib", "postgres_pss_mib", "broker_rss_mib"):
        rows.append(
            (
                f"{proc} 25%/end/peak",
                col(lambda r, p=proc: "{at_25pct}/{end}/{peak}".format(**r["ingest"]["memory"][p])),
            )
        )
    rows.append(("recompute s", col(lambda r: r["recompute"]["seconds"])))
    for mode in MODES:
        rows.append(
            (
                f"{mode} p50/p99 ms",
                col(lambda r, m=mode: f"{r['queries'][m]['p50_ms']}/{r['queries'][m]['p99_ms']}"),
            )
        )
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  " + "  ".join(f"{v:>16}" for v in vs) for name, vs in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help=f"one size of {QUICK_SIZE}")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    sizes = [QUICK_SIZE] if args.quick else [int(s) for s in args.sizes.split(",") if s]
    describe = ["git", "describe", "--always", "--dirty"]
    commit = subprocess.run(describe, cwd=ROOT, capture_output=True, text=True, check=False)
    reports = []
    for size in sizes:
        reports.append(one_size(size, args.seed, args.questions))
        report = {"commit": commit.stdout.strip(), "seed": args.seed, "sizes": reports}
        if args.out is not None:  # written after every size: a long run keeps what it measured
            args.out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(table(reports), file=sys.stderr)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
