"""What the query benchmarks on a bulk-built home share (bench_filters.py, bench_as_of.py,
bench_plans.py, bench_explorer.py, local_round_trips.py): timing a pass of requests, the median
of passes, and the run itself (start the home's PostgreSQL with a quarter of RAM as shared
buffers, migrate, hide a share of the documents if asked, prepare, measure, write the
report)."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _scale_harness import hide_share, unhide
from bench_bulk_scale import _quarter_of_memory
from synth_corpus import Corpus, questions

from services.core.access import Caller
from services.core.db import migrations
from services.core.infra.postgres import EmbeddedPostgres
from services.core.settings import Settings
from services.retrieval.schemas import QueryRequest


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed_pass(
    service: Any, requests: Sequence[QueryRequest], caller: Caller
) -> dict[str, float]:
    """p50 and p99 (ms) of the requests in turn, after an untimed warm-up with the first, and
    how many found no context."""
    await service.query(requests[0], caller)
    ms: list[float] = []
    empty = 0
    for request in requests:
        t0 = time.perf_counter()
        resp = await service.query(request, caller)
        ms.append((time.perf_counter() - t0) * 1000)
        empty += not resp.contexts
    return {
        "p50_ms": round(percentile(ms, 0.5), 1),
        "p99_ms": round(percentile(ms, 0.99), 1),
        "no_contexts": empty,
    }


def median_row(passes: Sequence[dict[str, float]], base: dict[str, Any] | None) -> dict[str, Any]:
    """The median of each percentile over the passes, with the p50's ratio to ``base``'s."""
    row: dict[str, Any] = {
        "p50_ms": round(statistics.median(p["p50_ms"] for p in passes), 1),
        "p99_ms": round(statistics.median(p["p99_ms"] for p in passes), 1),
        "no_contexts": passes[0]["no_contexts"],
    }
    if base is not None:
        row["p50_ratio"] = round(row["p50_ms"] / base["p50_ms"], 2)
    return row


def home_arguments(doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--home", type=Path, required=True, help="a bulk-built home")
    parser.add_argument("--documents", type=int, required=True, help="as it was built")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    return parser


@contextmanager
def started_home(home: Path, report: dict[str, Any], hide: float = 0.0) -> Iterator[str]:
    """The home's PostgreSQL started (a quarter of RAM as shared buffers) and migrated; its
    URL. With ``hide``, that share of the documents is hidden from the anonymous caller for the
    run (``report["hidden"]``: how many) and shown again after it."""
    settings = Settings()
    pg = EmbeddedPostgres(home, settings.embedded_user, shared_buffers=_quarter_of_memory())
    url = pg.start()
    try:
        migrations.upgrade(url, settings.embedding_dim)
        if hide:
            report["hidden"] = hide_share(url, hide)
        try:
            yield url
        finally:
            if hide:
                unhide(url)
    finally:
        pg.stop()


def write_report(report: dict[str, Any], out: Path | None) -> None:
    """Print the report as JSON (and write it to ``out``)."""
    text_out = json.dumps(report, indent=2)
    if out:
        out.write_text(text_out + "\n")
    print(text_out, file=sys.stdout)


def run_on_home(
    args: argparse.Namespace,
    report: dict[str, Any],
    prepare: Callable[[str], Coroutine[Any, Any, dict[str, Any]]],
    measure: Callable[[str, list[dict[str, Any]]], Coroutine[Any, Any, dict[str, Any]]],
) -> None:
    """Start the home, migrate, ``prepare`` it, ``measure`` the generated questions; print the
    report (and write it to ``--out``)."""
    with started_home(args.home, report) as url:
        report["prepare"] = asyncio.run(prepare(url))
        events = list(Corpus(args.documents, args.seed).events())
        asked = questions(events, args.questions, args.seed)
        del events
        report["queries"] = asyncio.run(measure(url, asked))
    write_report(report, args.out)
