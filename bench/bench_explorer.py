"""What the graph explorer's data routes cost (issue 34: the neighbourhood of an entity with
1,000 neighbours renders, capped, in under a second on the 1M-entity bulk-built database), and
how long the page itself takes to draw it in headless Chromium:

    flock /tmp/kg-heavy.lock .venv/bin/python bench/bench_explorer.py \\
        --home /var/tmp/kg-bulk-1m [--runs 3] [--entities 30] [--hide-share 0.5] \\
        [--browser] [--out F]

Starts the home's PostgreSQL (shared_buffers 25% of RAM), migrates it, and draws (seeded)
``--entities`` entities of each kind: "named" (2 to 200 mentions, as a person looks one up)
and "busy" (800 to 1,200 neighbours: the issue's case). Times, as the operator and as the
anonymous caller (with ``--hide-share``: half the documents hidden from it), each read the
page makes when it opens an entity, in the route's own read transaction (what
/v1/entities/{id}/neighbourhood and the others run): the neighbourhood (1 and 2 hops, the
page's default cap of 150 nodes), the entity's detail, its mentions, its communities and one
relationship's evidence. ``--runs`` passes, the median of p50 and p99 (ms).

With ``--browser``, also serves the query API on this database and opens
/explorer?entity=NAME for each busy entity in headless Chromium (Debian's chromium, driven
over the DevTools protocol: tests/support/cdp.py), timing navigation to the page's ready
state: the page's own fetches, Cytoscape's layout and drawing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from query_timing import percentile, started_home, write_report  # noqa: E402
from sqlalchemy import text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncConnection  # noqa: E402

from services.core.access import Caller  # noqa: E402
from services.core.db.engine import UNBOUNDED, make_engine  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.retrieval.entities import entity_detail  # noqa: E402
from services.retrieval.explore import (  # noqa: E402
    entity_mentions,
    neighbourhood,
    relationship_detail,
)
from services.retrieval.global_mode import list_communities  # noqa: E402
from services.retrieval.visibility import widened  # noqa: E402

LIMIT = 150  # the page's default cap
_NAMED = text(
    "SELECT id, name FROM entities WHERE mention_count BETWEEN 2 AND 200"
    " ORDER BY md5(id::text || :seed) LIMIT :n"
)
# Entities with about a thousand distinct neighbours (both ways), drawn from a seeded sample
# of relationships so the read stays a sample, not a scan of every relationship.
_BUSY = text(
    "WITH d AS (SELECT e, count(DISTINCT o) AS n FROM ("
    "  SELECT source_id AS e, target_id AS o FROM relationships"
    "  UNION ALL SELECT target_id, source_id FROM relationships) t GROUP BY e)"
    " SELECT d.e, x.name FROM d JOIN entities x ON x.id = d.e WHERE d.n BETWEEN 800 AND 1200"
    " ORDER BY md5(d.e::text || :seed) LIMIT :n"
)
_ONE_RELATIONSHIP = text(
    "SELECT id FROM relationships WHERE source_id = :e OR target_id = :e"
    " ORDER BY weight DESC, id LIMIT 1"
)

Read = Callable[[AsyncConnection, int, Caller], Awaitable[Any]]


async def _relationship(conn: AsyncConnection, entity: int, caller: Caller) -> Any:
    rel = await conn.scalar(_ONE_RELATIONSHIP, {"e": entity})
    return None if rel is None else await relationship_detail(conn, int(rel), caller=caller)


async def _communities(conn: AsyncConnection, entity: int, caller: Caller) -> Any:
    snapshot = await conn.scalar(text("SELECT max(id) FROM snapshots WHERE status = 'published'"))
    if snapshot is None:
        return []
    return await list_communities(conn, int(snapshot), None, 10, caller=caller, entity=entity)


READS: dict[str, Read] = {
    "neighbourhood, 1 hop": lambda c, e, who: neighbourhood(c, e, 1, LIMIT, caller=who),
    "neighbourhood, 2 hops": lambda c, e, who: neighbourhood(c, e, 2, LIMIT, caller=who),
    "entity detail": lambda c, e, who: entity_detail(c, e, 10, caller=who),
    "mentions": lambda c, e, who: entity_mentions(c, e, 10, caller=who),
    "communities": _communities,
    "a relationship's evidence": _relationship,
}


async def _pass(url: str, read: Read, entities: list[int], caller: Caller) -> dict[str, Any]:
    engine = make_engine(url, timeouts=UNBOUNDED)
    ms: list[float] = []
    drawn: list[int] = []
    try:
        for entity in entities:
            t0 = time.perf_counter()
            async with engine.connect() as conn, conn.begin():
                await conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
                found = await read(conn, entity, await widened(conn, caller))
            ms.append((time.perf_counter() - t0) * 1000)
            if found is not None and hasattr(found, "nodes"):
                drawn.append(len(found.nodes))
    finally:
        await engine.dispose()
    return {
        "p50_ms": round(percentile(ms, 0.5), 1),
        "p99_ms": round(percentile(ms, 0.99), 1),
        "median_nodes": statistics.median(drawn) if drawn else None,
    }


async def _draw(url: str, args: argparse.Namespace) -> dict[str, list[tuple[int, str]]]:
    engine = make_engine(url, timeouts=UNBOUNDED)
    try:
        async with engine.connect() as conn:
            values = {"seed": str(args.seed), "n": args.entities}
            named = [(int(r[0]), str(r[1])) for r in (await conn.execute(_NAMED, values)).all()]
            t0 = time.perf_counter()
            busy = [(int(r[0]), str(r[1])) for r in (await conn.execute(_BUSY, values)).all()]
            print(f"busy entities found in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    finally:
        await engine.dispose()
    return {"named": named, "busy": busy}


async def _measure(url: str, drawn: dict[str, list[tuple[int, str]]], runs: int) -> dict[str, Any]:
    callers = {"operator": Caller.operator(), "anonymous": Caller()}
    out: dict[str, Any] = {}
    for kind, entities in drawn.items():
        ids = [e for e, _ in entities]
        for name, read in READS.items():
            for who, caller in callers.items():
                await _pass(url, read, ids[:3], caller)  # warm-up
                passes = [await _pass(url, read, ids, caller) for _ in range(runs)]
                row = {
                    "p50_ms": round(statistics.median(p["p50_ms"] for p in passes), 1),
                    "p99_ms": round(statistics.median(p["p99_ms"] for p in passes), 1),
                    "median_nodes": passes[0]["median_nodes"],
                }
                out[f"{kind}.{name}.{who}"] = row
                print(f"{kind:<6} {name:<26} {who:<10} {row}", file=sys.stderr, flush=True)
    return out


def _browser_times(url: str, names: list[str], shot: Path | None) -> dict[str, Any]:
    """Navigation to ready, per busy entity, in headless Chromium against a served API."""
    import shutil

    from services.core.embedding import OnnxMiniLmEmbedder
    from services.core.extraction import SpacyExtractor
    from services.core.infra.manager import Endpoints
    from services.query_api.app import create_app
    from services.retrieval.service import build_query_service
    from tests.support.cdp import browser
    from tests.support.server import serve

    binary = shutil.which("chromium")
    if binary is None:
        return {"skipped": "chromium is not installed (apt-get install chromium)"}
    settings = Settings(database_url=url)
    pool = ThreadPoolExecutor(2)
    service = build_query_service(
        settings, make_engine(url), OnnxMiniLmEmbedder(), SpacyExtractor(), pool
    )
    ms: list[float] = []
    drawn: list[int] = []
    parts: list[dict[str, float]] = []
    whole: list[float] = []
    with (
        serve(create_app(settings, Endpoints(url, "127.0.0.1:1"), service=service)) as base,
        tempfile.TemporaryDirectory() as profile,
        browser(binary, Path(profile)) as page,
    ):
        page.goto(f"{base}/explorer")
        for name in names:
            t0 = time.perf_counter()
            page.goto(f"{base}/explorer?entity={quote(name)}")
            page.wait_for("document.body.dataset.state === 'ready'", timeout_s=120)
            ms.append((time.perf_counter() - t0) * 1000)  # drawn, its status line written
            drawn.append(int(page.evaluate("document.getElementById('graph').dataset.nodes")))
            parts.append(page.wait_for("window.explorer.timings", timeout_s=120))
            whole.append((time.perf_counter() - t0) * 1000)  # and the entity's details shown
        if shot is not None:  # the last one, to look at
            page.screenshot(shot)
    pool.shutdown()
    return {
        "p50_ms": round(percentile(ms, 0.5), 1),
        "p99_ms": round(percentile(ms, 0.99), 1),
        "max_ms": round(max(ms), 1),
        "with_details_p50_ms": round(percentile(whole, 0.5), 1),
        "with_details_p99_ms": round(percentile(whole, 0.99), 1),
        "median_nodes": statistics.median(drawn),
        "entities": len(names),
        # the page's own split of its work: the neighbourhood's fetch, the layout and drawing,
        # and the first entity's details (four more fetches)
        "median_parts_ms": {k: round(statistics.median(p[k] for p in parts), 1) for k in parts[0]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", maxsplit=1)[0])
    parser.add_argument("--home", type=Path, required=True, help="a bulk-built home")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--entities", type=int, default=30)
    parser.add_argument("--hide-share", type=float, default=0.0)
    parser.add_argument("--browser", action="store_true", help="time the page in Chromium")
    parser.add_argument("--browser-only", action="store_true", help="only the page's timing")
    parser.add_argument("--shot", type=Path, default=None, help="a PNG of the last entity")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report: dict[str, Any] = {"home": str(args.home), "runs": args.runs, "cap": LIMIT}
    with started_home(args.home, report, args.hide_share) as url:
        drawn = asyncio.run(_draw(url, args))
        report["drawn"] = {k: len(v) for k, v in drawn.items()}
        if not args.browser_only:
            report["reads"] = asyncio.run(_measure(url, drawn, args.runs))
        if args.browser or args.browser_only:
            names = [n for _, n in drawn["busy"]]
            report["browser"] = _browser_times(url, names, args.shot)
            print(f"browser {report['browser']}", file=sys.stderr, flush=True)
    write_report(report, args.out)


if __name__ == "__main__":
    main()
