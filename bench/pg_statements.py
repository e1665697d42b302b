"""Where the indexer's PostgreSQL time goes: ingest events in-process through the indexer's
handler into a fresh embedded PostgreSQL with ``pg_stat_statements`` loaded, then print the
statements by total execution time (per document and per call), and the server's CPU.

    .venv/bin/python bench/pg_statements.py [EVENTS.jsonl] [--quick] [--top 15]

The handler runs the same statements as the worker's write phase (one transaction per event);
what this does not show is the worker's pipelining and the broker. The default input is the
994-document HotpotQA set; ``--quick`` takes its first 100 events. Output: JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.core.db import migrations  # noqa: E402
from services.core.db.engine import UNBOUNDED, make_engine  # noqa: E402
from services.core.infra.postgres import ADMIN_USER, DB_NAME, EmbeddedPostgres  # noqa: E402
from services.core.models import build_embedder, build_extractor  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.eval.runner import _no_dead_letter_topic, ingest, load_jsonl  # noqa: E402
from services.indexer.handlers import IndexerDeps  # noqa: E402

DEFAULT = ROOT.parent / "shared" / "data" / "hotpotqa-train100" / "events_full.jsonl"
QUICK_EVENTS = 100
_TOP = """
SELECT calls, total_exec_time, rows, query FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)
ORDER BY total_exec_time DESC LIMIT %s
"""


def _admin(pg: EmbeddedPostgres, database: str) -> psycopg.Connection[Any]:
    dsn = (
        f"host=127.0.0.1 port={pg.port} dbname={database} user={ADMIN_USER}"
        f" password={pg.password(ADMIN_USER)}"
    )
    return psycopg.connect(dsn, autocommit=True)


def _stat(pid: str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _server_cpu_s(pg: EmbeddedPostgres) -> float:
    """User + system CPU seconds of the postmaster and its children (backends, autovacuum,
    WAL writer, ...), found through /proc: the postmaster is the process whose command line
    names our data directory (postmaster.pid may be unreadable to us)."""
    pids = [p.name for p in Path("/proc").iterdir() if p.name.isdigit()]
    marker = str(pg.data_dir).encode()
    root = None
    for pid in pids:
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                root = pid
                break
        except OSError:
            continue
    total, tick = 0.0, float(os.sysconf("SC_CLK_TCK"))
    for pid in pids:
        fields = _stat(pid)
        if fields is not None and (pid == root or fields[1] == root):  # fields[1]: ppid
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


async def _ingest(
    url: str, events: list[dict[str, Any]], pg: EmbeddedPostgres
) -> tuple[dict[str, int], float, float]:
    """Outcome counts, wall seconds, server CPU seconds (read before the pool's backends go)."""
    settings = Settings()
    engine = make_engine(url, timeouts=UNBOUNDED)
    with ThreadPoolExecutor(max_workers=1) as pool:
        deps = IndexerDeps.from_settings(
            settings,
            engine=engine,
            embedder=build_embedder(settings, None),
            extractor=build_extractor(settings, None),
            executor=pool,
            publish_dead_letter=_no_dead_letter_topic,
        )
        try:
            cpu0, t0 = _server_cpu_s(pg), time.perf_counter()
            outcomes = await ingest(deps, events, progress=True)
            return outcomes, time.perf_counter() - t0, _server_cpu_s(pg) - cpu0
        finally:
            await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("events", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--quick", action="store_true", help=f"first {QUICK_EVENTS} events")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    events = load_jsonl(args.events)[: QUICK_EVENTS if args.quick else None]
    with tempfile.TemporaryDirectory(prefix="kg-pgstat-") as home:
        pg = EmbeddedPostgres(Path(home))
        try:
            url = pg.start()
            with _admin(pg, "postgres") as conn:
                conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
                conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
            pg.stop()
            url = pg.start()
            migrations.upgrade(url, 384)
            with _admin(pg, DB_NAME) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
            outcomes, wall, cpu = asyncio.run(_ingest(url, events, pg))
            with _admin(pg, DB_NAME) as conn:
                rows = conn.execute(_TOP, (DB_NAME, args.top)).fetchall()
                everything = conn.execute(
                    "SELECT sum(total_exec_time), sum(calls) FROM pg_stat_statements"
                    " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)",
                    (DB_NAME,),
                ).fetchone()
        finally:
            pg.purge()
    n = len(events)
    total_ms, total_calls = (
        (float(everything[0] or 0), int(everything[1] or 0)) if everything else (0.0, 0)
    )
    report = {
        "documents": n,
        "outcomes": outcomes,
        "wall_s": round(wall, 1),
        "server_cpu_s": round(cpu, 1),
        "statements_ms_per_doc": round(total_ms / n, 2),
        "calls_per_doc": round(total_calls / n, 1),
        "top": [
            {
                "ms_per_doc": round(float(total) / n, 2),
                "share": round(float(total) / total_ms, 3) if total_ms else 0.0,
                "calls_per_doc": round(int(calls) / n, 2),
                "ms_per_call": round(float(total) / max(int(calls), 1), 3),
                "rows_per_call": round(int(rs) / max(int(calls), 1), 1),
                "query": " ".join(str(query).split())[:300],
            }
            for calls, total, rs, query in rows
        ],
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
