"""Where a query mode's time goes: the service's own stage timings, and every SQL statement it
runs timed at the cursor (SQLAlchemy events), the costliest then run again under
EXPLAIN (ANALYZE, BUFFERS) with the parameters of their slowest call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.access import Caller
from services.retrieval.schemas import QueryRequest
from services.retrieval.service import QueryService


@dataclass
class Calls:
    """Every call of one statement: durations in ms and the parameters of the slowest."""

    ms: list[float] = field(default_factory=list)
    slowest: Any = None

    def add(self, ms: float, parameters: Any) -> None:
        if not self.ms or ms > max(self.ms):
            self.slowest = parameters
        self.ms.append(ms)


@dataclass
class StatementTimer:
    """Times every statement the engine runs while attached."""

    engine: AsyncEngine
    calls: dict[str, Calls] = field(default_factory=dict)

    def _before(self, conn: Any, *_: Any) -> None:
        conn.info.setdefault("bench_t0", []).append(time.perf_counter())

    def _after(self, conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        ms = (time.perf_counter() - conn.info["bench_t0"].pop()) * 1000
        self.calls.setdefault(statement, Calls()).add(ms, parameters)

    def __enter__(self) -> StatementTimer:
        event.listen(self.engine.sync_engine, "before_cursor_execute", self._before)
        event.listen(self.engine.sync_engine, "after_cursor_execute", self._after)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine.sync_engine, "before_cursor_execute", self._before)
        event.remove(self.engine.sync_engine, "after_cursor_execute", self._after)

    def costliest(self, n: int) -> list[tuple[str, Calls]]:
        """The ``n`` statements with the largest total time."""
        return sorted(self.calls.items(), key=lambda kv: -sum(kv[1].ms))[:n]


async def explain(engine: AsyncEngine, statement: str, parameters: Any) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of one SELECT with the given driver-level parameters."""
    async with engine.connect() as conn:
        result = await conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)
        return [str(row[0]) for row in result]


async def profile_mode(
    service: QueryService,
    engine: AsyncEngine,
    asked: Sequence[dict[str, Any]],
    mode: str,
    top: int = 3,
    *,
    caller: Caller | None = None,
) -> dict[str, Any]:
    """Ask every question once more in ``mode`` with the statement timer attached, as
    ``caller`` (the operator when None): median stage timings, the ``top`` statements by total
    time, and a plan of each at its slowest."""
    stages: dict[str, list[float]] = {}
    who = caller or Caller.operator()
    with StatementTimer(engine) as timer:
        for q in asked:
            req = QueryRequest(question=q["question"], mode=mode, k=20, explain=False)
            response = await service.query(req, who)
            for name, ms in response.timings.items():
                stages.setdefault(name, []).append(ms)
    statements = []
    for statement, calls in timer.costliest(top):
        try:
            plan = [line[:240] for line in await explain(engine, statement, calls.slowest)]
        except Exception as exc:  # noqa: BLE001 - a plan is a bonus, the timings stand
            plan = [f"EXPLAIN failed: {type(exc).__name__}: {exc}"[:300]]
        statements.append(
            {
                "statement": " ".join(statement.split())[:600],
                "calls": len(calls.ms),
                "calls_per_query": round(len(calls.ms) / max(len(asked), 1), 2),
                "total_ms": round(sum(calls.ms), 1),
                "median_ms": round(statistics.median(calls.ms), 2),
                "max_ms": round(max(calls.ms), 1),
                "plan_at_slowest": plan,
            }
        )
    return {
        "mode": mode,
        "questions": len(asked),
        "stage_median_ms": {k: round(statistics.median(v), 2) for k, v in stages.items()},
        "statement_ms_per_query": round(
            sum(sum(c.ms) for c in timer.calls.values()) / max(len(asked), 1), 2
        ),
        "costliest_statements": statements,
    }
