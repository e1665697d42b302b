"""The dashboard's history from the database: per-bucket (a minute by default) applied events
and freshness percentiles from processed_events, dead letters by reason, tokens by purpose
and model, and the snapshot history with recompute durations. Every series lies on one grid
(services/core/series.py); the database clock decides what "now" is."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.activity import APPLIED, OCCURRED_PLAUSIBLE, snapshot_history
from services.core.series import chart, grid, on_grid, per_second

_EVENTS = text(
    "SELECT floor(extract(epoch FROM processed_at) / :step) * :step AS at,"  # noqa: S608 - OCCURRED_PLAUSIBLE is a constant
    " count(*) AS handled,"
    " count(*) FILTER (WHERE outcome = ANY(:applied)) AS applied,"
    " percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - occurred_at))"
    f"   FILTER (WHERE outcome = ANY(:applied) AND {OCCURRED_PLAUSIBLE}) AS occurred_p50,"
    " percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - occurred_at))"
    f"   FILTER (WHERE outcome = ANY(:applied) AND {OCCURRED_PLAUSIBLE}) AS occurred_p99,"
    " percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - published_at))"
    "   FILTER (WHERE outcome = ANY(:applied)) AS published_p50,"
    " percentile_cont(0.99) WITHIN GROUP"
    "   (ORDER BY extract(epoch FROM processed_at - published_at))"
    "   FILTER (WHERE outcome = ANY(:applied)) AS published_p99"
    " FROM processed_events WHERE processed_at >= to_timestamp(:start) GROUP BY 1"
)
_DEAD_LETTERS = text(
    "SELECT floor(extract(epoch FROM created_at) / :step) * :step AS at, reason AS name,"
    " count(*) AS n"
    " FROM dead_letters WHERE created_at >= to_timestamp(:start) GROUP BY 1, 2"
)
_TOKENS = text(
    "SELECT floor(extract(epoch FROM created_at) / :step) * :step AS at,"
    " purpose || ' · ' || model AS name,"
    " sum(prompt_tokens + completion_tokens) AS n"
    " FROM token_usage WHERE created_at >= to_timestamp(:start) GROUP BY 1, 2"
)
FRESHNESS_SERIES = {
    "p50 since occurred": "occurred_p50",
    "p99 since occurred": "occurred_p99",
    "p50 since published": "published_p50",
    "p99 since published": "published_p99",
}


async def database_now(conn: AsyncConnection) -> float:
    """Seconds since the epoch by the database clock."""
    return float(await conn.scalar(text("SELECT extract(epoch FROM now())")) or 0.0)


async def _counts_by_name(
    conn: AsyncConnection, sql: Any, times: list[float], step_s: float, empty: str
) -> dict[str, list[float | None]]:
    """One zero-filled count series per name; a single ``empty`` series of zeros when nothing
    happened in the window (a flat line says "none", an empty chart says nothing)."""
    found: dict[str, dict[float, float | None]] = defaultdict(dict)
    for r in (await conn.execute(sql, {"step": step_s, "start": times[0]})).all():
        found[str(r.name)][float(r.at)] = float(r.n)
    if not found:
        return {empty: on_grid(times, {}, 0.0)}
    return {name: on_grid(times, found[name], 0.0) for name in sorted(found)}


async def history(conn: AsyncConnection, window_s: float, step_s: float) -> dict[str, Any]:
    """Charts from the database over the last ``window_s`` seconds, one point per ``step_s``:
    throughput, freshness, dead_letters, tokens (on the grid) and snapshots (one point each)."""
    now = await database_now(conn)
    times = grid(now, window_s, step_s)
    rows = (
        await conn.execute(_EVENTS, {"step": step_s, "start": times[0], "applied": list(APPLIED)})
    ).all()
    by_t = {float(r.at): r for r in rows}
    applied = on_grid(times, {t: float(r.applied) for t, r in by_t.items()}, 0.0)
    handled = on_grid(times, {t: float(r.handled) for t, r in by_t.items()}, 0.0)
    fresh = {
        name: on_grid(
            times,
            {
                t: None if getattr(r, col) is None else float(getattr(r, col))
                for t, r in by_t.items()
            },
            None,
        )
        for name, col in FRESHNESS_SERIES.items()
    }
    snaps = list(reversed(await snapshot_history(conn)))
    return {
        "now": now,
        "throughput": chart(
            "events/s",
            times,
            {
                "applied": per_second(times, applied, step_s, now),
                "handled": per_second(times, handled, step_s, now),
            },
        ),
        "freshness": chart("s", times, fresh),
        "dead_letters": chart(
            "dead letters/bucket",
            times,
            await _counts_by_name(conn, _DEAD_LETTERS, times, step_s, "no dead letters"),
        ),
        "tokens": chart(
            "tokens/bucket",
            times,
            await _counts_by_name(conn, _TOKENS, times, step_s, "no tokens reported"),
        ),
        "snapshots": {
            **chart(
                "s",
                [_epoch(s["created_at"]) for s in snaps],
                {"recompute duration": [s["recompute_s"] for s in snaps]},
            ),
            "rows": snaps,
        },
    }


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()
