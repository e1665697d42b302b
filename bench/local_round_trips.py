"""Where local mode's time goes on a bulk-built home (issue 32, step 3): for each generated
question, as the operator, the statements it sends to the database (round trips, counted by
a SQLAlchemy cursor event, grouped by the module that sent them) and the time spent in them,
against the whole query; with the walked graph held in memory and without.

    flock /tmp/kg-heavy.lock .venv/bin/python bench/local_round_trips.py \
        --home /var/tmp/kg-bulk-38k --documents 38000 --questions 60 [--profile 15]

``--profile N``: cProfile of N more questions with the graph held, the functions with the
most time of their own."""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_scale import query_service
from query_timing import home_arguments, run_on_home
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.settings import Settings
from services.retrieval.schemas import QueryRequest

K = 20  # the scale benches' k


class Statements:
    """Counts the statements of an engine (a cursor event: every round trip) and their time,
    and by the retrieval function that sent them (AsyncConnection's methods wrapped: the
    innermost frame under services/retrieval; the cursor event runs where that stack is not)."""

    def __init__(self) -> None:
        self.by_function: Counter[str] = Counter()
        self.ms_by_function: dict[str, float] = defaultdict(float)  # seconds, until reported
        self.count, self.seconds, self._started = 0, 0.0, 0.0

    def attach(self, engine: Any) -> None:
        event.listen(engine.sync_engine, "before_cursor_execute", self._before)
        event.listen(engine.sync_engine, "after_cursor_execute", self._after)
        for name in ("execute", "scalar", "scalars"):
            self._wrap(name)

    def _wrap(self, name: str) -> None:
        real = getattr(AsyncConnection, name)
        counter, spent = self.by_function, self.ms_by_function

        async def counted(conn: AsyncConnection, *args: Any, **kwargs: Any) -> Any:
            frames = [
                f for f in traceback.extract_stack(limit=12) if "/services/retrieval/" in f.filename
            ]
            where = f"{Path(frames[-1].filename).stem}.{frames[-1].name}" if frames else "other"
            counter[where] += 1
            started = time.perf_counter()
            try:
                return await real(conn, *args, **kwargs)
            finally:
                spent[where] += time.perf_counter() - started

        setattr(AsyncConnection, name, counted)

    def _before(self, *_: Any) -> None:
        self._started = time.perf_counter()
        self.count += 1

    def _after(self, *_: Any) -> None:
        self.seconds += time.perf_counter() - self._started


async def _measure(url: str, asked: list[dict[str, Any]], args: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for held in (True, False):
        settings = Settings(query_graph_memory=held)
        async with query_service(settings, url) as (service, engine):
            counter = Statements()
            counter.attach(engine)
            first = QueryRequest(question=asked[0]["question"], mode="local", k=K)
            await service.query(first, Caller.operator())  # warm-up
            per_query, totals, sql = [], [], []
            counter.by_function.clear()
            counter.ms_by_function.clear()
            for q in asked:
                req = QueryRequest(question=q["question"], mode="local", k=K)
                n0, s0 = counter.count, counter.seconds
                t0 = time.perf_counter()
                await service.query(req, Caller.operator())
                totals.append((time.perf_counter() - t0) * 1000)
                per_query.append(counter.count - n0)
                sql.append((counter.seconds - s0) * 1000)
            n = len(asked)
            out["memory" if held else "database"] = {
                "statements_median": statistics.median(per_query),
                "statements_max": max(per_query),
                "total_ms_median": round(statistics.median(totals), 1),
                "sql_ms_median": round(statistics.median(sql), 1),
                "statements_by_function_per_query": {
                    m: round(c / n, 2) for m, c in counter.by_function.most_common()
                },
                "ms_by_function_per_query": {
                    m: round(c * 1000 / n, 2)
                    for m, c in sorted(counter.ms_by_function.items(), key=lambda i: -i[1])
                },
            }
            if held and args.profile:
                profiler = cProfile.Profile()
                profiler.enable()
                for q in asked[: args.profile]:
                    req = QueryRequest(question=q["question"], mode="local", k=K)
                    await service.query(req, Caller.operator())
                profiler.disable()
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
                print(text.getvalue(), file=sys.stderr)
    return out


async def _nothing(url: str) -> dict[str, Any]:  # noqa: ARG001 - the home is measured as built
    return {}


def main() -> None:
    parser = home_arguments(__doc__ or "")
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--profile", type=int, default=0)
    args = parser.parse_args()
    report: dict[str, Any] = {"bench": "local_round_trips", "k": K}
    run_on_home(args, report, _nothing, lambda url, asked: _measure(url, asked, args))


if __name__ == "__main__":
    main()
