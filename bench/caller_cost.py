"""What a restricted caller pays against the operator (issue 20): on a kept eval database,
every question once per mode as the operator (admin: the unfiltered statements) and as an
anonymous caller (no key: tenant NULL, no groups; every document is visible to it here, so it
reads as the operator does) and, with --half, a caller who sees half the documents (the
visibility-filtered statements), one at a time through an in-process QueryService with the
API's model threads; then the most restricted caller's costliest statements with their plans
(bench/_statement_profile.py).

    .venv/bin/python bench/caller_cost.py --keep DIR --questions Q.jsonl [--modes local,global]
        [--limit 50] [--top 5] [--half] [--out report.json]

DIR is a `kgstream eval --keep` home (global mode needs its community snapshot). Prints p50 /
p90 / p99 per mode and caller, the CPU a query costs this process (the API's part: models and
Python) and PostgreSQL, and the profile as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _query_api import quantile  # noqa: E402
from _statement_profile import profile_mode  # noqa: E402

from services.core.access import Caller  # noqa: E402
from services.core.infra.postgres import EmbeddedPostgres  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.retrieval.compose import build_service  # noqa: E402
from services.retrieval.schemas import QueryRequest  # noqa: E402

CALLERS = {"operator": Caller.operator(), "anonymous": Caller()}
# --half: every other document (by doc_id) gets the ACL ["g1"] for the run (restored after),
# and a third caller, in group g2, sees only the other half: the filtered reads.
HALF = Caller(groups=frozenset({"g2"}))
_SET_HALF = (
    "UPDATE documents d SET acl = CASE WHEN o.i % 2 = 0 THEN CAST(:acl AS text[]) END"
    " FROM (SELECT doc_id, row_number() OVER (ORDER BY doc_id) AS i FROM documents) o"
    " WHERE o.doc_id = d.doc_id"
)


def server_cpu_s(postmaster: int) -> float:
    """CPU seconds (user + system) of the postmaster and its live children (the pooled
    backends, which live through a run) from /proc."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == postmaster or int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def timed(service: Any, questions: list[str], mode: str, caller: Caller) -> list[float]:
    out = []
    for question in questions:
        start = time.perf_counter()
        await service.query(QueryRequest(question=question, mode=mode, k=10), caller)
        out.append((time.perf_counter() - start) * 1000)
    return out


async def run(args: argparse.Namespace, url: str, questions: list[str]) -> dict[str, Any]:
    service = build_service(Settings(), url)
    report: dict[str, Any] = {"questions": len(questions), "modes": {}}
    callers = dict(CALLERS)
    if args.half:
        callers["half"] = HALF
        async with service.engine.begin() as conn:
            await conn.execute(text(_SET_HALF), {"acl": ["g1"]})
    profiled = callers["half" if args.half else "anonymous"]
    try:
        for mode in args.modes.split(","):
            figures: dict[str, Any] = {}
            for name, caller in callers.items():
                await timed(service, questions[:3], mode, caller)  # warm-up, untimed
                cpu0, server0 = time.process_time(), server_cpu_s(args.postmaster)
                ms = await timed(service, questions, mode, caller)
                cpu, server = time.process_time() - cpu0, server_cpu_s(args.postmaster) - server0
                figures[name] = {
                    "p50": round(statistics.median(ms), 1),
                    "p90": round(quantile(ms, 0.9), 1),
                    "p99": round(quantile(ms, 0.99), 1),
                    # CPU a query: this process (models, Python) and PostgreSQL
                    "api_cpu_ms": round(cpu * 1000 / len(questions), 1),
                    "db_cpu_ms": round(server * 1000 / len(questions), 1),
                }
                print(mode, name, figures[name], flush=True)
            if args.top:
                figures["restricted_profile"] = await profile_mode(
                    service,
                    service.engine,
                    [{"question": q} for q in questions],
                    mode,
                    args.top,
                    caller=profiled,
                )
            report["modes"][mode] = figures
    finally:
        if args.half:
            async with service.engine.begin() as conn:
                await conn.execute(text("UPDATE documents SET acl = NULL"))
        await service.engine.dispose()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, required=True)
    parser.add_argument("--questions", type=Path, required=True)
    parser.add_argument("--modes", default="vector,local,global")
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--half", action="store_true", help="also a caller seeing half")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    pg = EmbeddedPostgres(args.keep)
    url = pg.start()
    args.postmaster = pg.pid()
    try:
        questions = [
            json.loads(line)["question"]
            for line in args.questions.read_text().splitlines()
            if line.strip()
        ][: args.limit]
        report = asyncio.run(run(args, url, questions))
    finally:
        pg.stop()
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
