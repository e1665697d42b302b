"""Where local mode's time goes on a bulk-built home (issue 32, step 3): for each generated
question, as the operator, the statements it sends to the database (round trips, counted by
a SQLAlchemy cursor event, grouped by the function that sent them) and the time spent in them,
against the whole query; with the walked graph held in memory and without, each after an
untimed warm-up pass over the same questions.

    flock /tmp/kg-heavy.lock .venv/bin/python bench/local_round_trips.py \
        --home /var/tmp/kg-bulk-38k --documents 38000 --questions 60 [--profile 15] \
        [--hide-share 0.5]

``--profile N``: cProfile of N more questions with the graph held, the functions with the
most time of their own (``PROFILE_SORT=cumulative PROFILE_ROWS=60`` in the environment for
another order and length). ``--hide-share F``: the caller is anonymous and a share F of the
documents has an ACL it lacks (bench/_scale_harness.py ``hide_share``, undone at the end): a
caller who sees part of the corpus; the slowest question's statements are reported too."""

from __future__ import annotations

import cProfile
import inspect
import io
import os
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

from _scale_harness import hide_share, unhide
from bench_scale import query_service
from query_timing import home_arguments, run_on_home
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.settings import Settings
from services.retrieval import chain_search, chains, local, neighbourhood, ranking
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


# Parts of local mode timed by wrapping them (wall time, summed per question): the walk's
# neighbourhood, the PPR, the fusion, the chains (their statements included).
TIMED = {
    "neighbourhood.around": (neighbourhood, "around"),
    "local.graph_scores (PPR)": (local, "graph_scores"),
    "chain_search.follow_chains": (chain_search, "follow_chains"),
    "chains.step": (chains, "step"),
    "ranking.fuse": (ranking, "fuse"),
}


def _timed(spent: dict[str, float]) -> None:
    for name, (module, attr) in TIMED.items():
        real = getattr(module, attr)
        if inspect.iscoroutinefunction(real):

            async def wrapped(*a: Any, _r: Any = real, _n: str = name, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return await _r(*a, **k)
                finally:
                    spent[_n] += time.perf_counter() - t0

        else:

            def wrapped(*a: Any, _r: Any = real, _n: str = name, **k: Any) -> Any:  # type: ignore[misc]
                t0 = time.perf_counter()
                try:
                    return _r(*a, **k)
                finally:
                    spent[_n] += time.perf_counter() - t0

        setattr(module, attr, wrapped)
        for user in (local, chain_search):  # the names they imported
            if getattr(user, attr, None) is real:
                setattr(user, attr, wrapped)


async def _measure(url: str, asked: list[dict[str, Any]], args: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    caller = Caller() if args.hide_share else Caller.operator()
    spent: dict[str, float] = defaultdict(float)
    _timed(spent)
    for held in (True, False):
        settings = Settings(query_graph_memory=held)
        async with query_service(settings, url) as (service, engine):
            counter = Statements()
            counter.attach(engine)
            for q in asked:  # a warm-up pass: both configurations read warm buffers
                req = QueryRequest(question=q["question"], mode="local", k=K)
                await service.query(req, caller)
            per_query, totals, sql = [], [], []
            slowest: tuple[float, str, dict[str, float]] = (0.0, "", {})
            parts: dict[str, list[float]] = defaultdict(list)  # the response's own timings
            counter.by_function.clear()
            counter.ms_by_function.clear()
            spent.clear()
            for q in asked:
                req = QueryRequest(question=q["question"], mode="local", k=K)
                n0, s0 = counter.count, counter.seconds
                before = dict(counter.ms_by_function)
                t0 = time.perf_counter()
                resp = await service.query(req, caller)
                totals.append((time.perf_counter() - t0) * 1000)
                if totals[-1] > slowest[0]:
                    spent_here = {
                        m: round((v - before.get(m, 0.0)) * 1000, 1)
                        for m, v in counter.ms_by_function.items()
                        if v - before.get(m, 0.0) > 0.0005
                    }
                    slowest = (totals[-1], q["question"], spent_here)
                for part, ms in resp.timings.items():
                    parts[part].append(ms)
                per_query.append(counter.count - n0)
                sql.append((counter.seconds - s0) * 1000)
            n = len(asked)
            out["memory" if held else "database"] = {
                "statements_median": statistics.median(per_query),
                "statements_max": max(per_query),
                "total_ms_median": round(statistics.median(totals), 1),
                "total_ms_max": round(max(totals), 1),
                "slowest": {"question": slowest[1], "sql_ms_by_function": slowest[2]},
                "sql_ms_median": round(statistics.median(sql), 1),
                "timings_median": {p: round(statistics.median(v), 1) for p, v in parts.items()},
                "parts_ms_per_query": {
                    p: round(v * 1000 / len(asked), 1) for p, v in spent.items()
                },
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
                    await service.query(req, caller)
                profiler.disable()
                text = io.StringIO()
                order = os.environ.get("PROFILE_SORT", "tottime")
                rows = int(os.environ.get("PROFILE_ROWS", "25"))
                pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(rows)
                print(text.getvalue(), file=sys.stderr)
    return out


def main() -> None:
    parser = home_arguments(__doc__ or "")
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--hide-share", type=float, default=0.0)
    args = parser.parse_args()
    report: dict[str, Any] = {"bench": "local_round_trips", "k": K, "hidden": args.hide_share}

    async def prepare(url: str) -> dict[str, Any]:
        return {"hidden_documents": hide_share(url, args.hide_share)} if args.hide_share else {}

    async def measure(url: str, asked: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            return await _measure(url, asked, args)
        finally:
            if args.hide_share:
                unhide(url)

    run_on_home(args, report, prepare, measure)


if __name__ == "__main__":
    main()
