"""What the service has been doing lately, for `kgstream status` and /v1/status: throughput
and freshness from processed_events, dead letters by reason, the change ratio against its
threshold, the snapshot history and token use. Reads run on the caller's connection (status
reads everything in one REPEATABLE READ snapshot).

An event counts as applied when it changed the index (outcome ``applied`` or ``deleted``);
handled counts every outcome. Freshness is measured on applied events: the time the event's
outcome was settled (``processed_at``, just before its commit) minus the event's
``occurred_at``, and minus the Kafka record's timestamp (``published_at``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.clocks import PLAUSIBLE_OCCURRENCE

APPLIED = ("applied", "deleted")
THROUGHPUT_WINDOWS_S = (60, 300)
SNAPSHOT_HISTORY = 10

_THROUGHPUT = text(
    "SELECT"
    " count(*) FILTER (WHERE processed_at > now() - make_interval(secs => :w1)) AS handled_1,"
    " count(*) FILTER (WHERE processed_at > now() - make_interval(secs => :w1)"
    "   AND outcome = ANY(:applied)) AS applied_1,"
    " count(*) AS handled_2,"
    " count(*) FILTER (WHERE outcome = ANY(:applied)) AS applied_2"
    " FROM processed_events WHERE processed_at > now() - make_interval(secs => :w2)"
)

# Freshness since occurrence counts only plausible occurrences (services/core/clocks.py,
# ``occurred_plausibly``, which the indexer's histogram uses too).
_PLAUSIBLE_S = int(PLAUSIBLE_OCCURRENCE.total_seconds())
OCCURRED_PLAUSIBLE = (
    f"occurred_at BETWEEN coalesce(published_at, processed_at) - interval '{_PLAUSIBLE_S} seconds'"
    f" AND coalesce(published_at, processed_at) + interval '{_PLAUSIBLE_S} seconds'"
)

_FRESHNESS = text(
    f"SELECT count(occurred_at) FILTER (WHERE {OCCURRED_PLAUSIBLE}) AS n_occurred,"  # noqa: S608 - OCCURRED_PLAUSIBLE is a constant
    f" count(occurred_at) FILTER (WHERE NOT ({OCCURRED_PLAUSIBLE})) AS n_excluded,"
    " count(published_at) AS n_published,"
    " percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - occurred_at))"
    f"   FILTER (WHERE {OCCURRED_PLAUSIBLE}) AS occurred_p50,"
    " percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - occurred_at))"
    f"   FILTER (WHERE {OCCURRED_PLAUSIBLE}) AS occurred_p99,"
    " percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - published_at))"
    "   AS published_p50,"
    " percentile_cont(0.99) WITHIN GROUP"
    "   (ORDER BY extract(epoch FROM processed_at - published_at)) AS published_p99"
    " FROM processed_events"
    " WHERE processed_at > now() - make_interval(secs => :w) AND outcome = ANY(:applied)"
)

_DEAD_LETTERS = text(
    "SELECT reason, count(*) AS n FROM dead_letters WHERE replayed_at IS NULL"
    " GROUP BY reason ORDER BY n DESC, reason"
)

_SNAPSHOTS = text(
    "SELECT id, status, created_at, published_at,"
    " extract(epoch FROM published_at - created_at) AS recompute_s,"
    " nodes, edges, communities, levels FROM snapshots ORDER BY id DESC LIMIT :n"
)

_TOKENS = text(
    "SELECT purpose, model, sum(prompt_tokens) AS prompt, sum(completion_tokens) AS completion,"
    " count(*) AS rows FROM token_usage GROUP BY purpose, model ORDER BY purpose, model"
)


def _round(value: Any, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)


async def throughput(conn: AsyncConnection) -> dict[str, Any]:
    """Events applied and handled over the last minute and five minutes, and per second."""
    w1, w2 = THROUGHPUT_WINDOWS_S
    row = (await conn.execute(_THROUGHPUT, {"w1": w1, "w2": w2, "applied": list(APPLIED)})).one()
    out: dict[str, Any] = {}
    for label, window, applied, handled in (
        ("1m", w1, row.applied_1, row.handled_1),
        ("5m", w2, row.applied_2, row.handled_2),
    ):
        out[label] = {
            "window_s": window,
            "applied": int(applied),
            "handled": int(handled),
            "applied_per_s": round(int(applied) / window, 3),
        }
    return out


async def freshness(conn: AsyncConnection, window_s: float) -> dict[str, Any]:
    """p50/p99 seconds from occurrence and from publication to commit, over applied events of
    the last ``window_s`` seconds (None when there were none). Since occurrence leaves out
    (and counts as ``excluded``) events that occurred more than a day from their publication:
    back-fills and broken clocks, whose ages say nothing about the pipeline."""
    row = (await conn.execute(_FRESHNESS, {"w": window_s, "applied": list(APPLIED)})).one()
    return {
        "window_s": window_s,
        "since_occurred": {
            "events": int(row.n_occurred),
            "excluded": int(row.n_excluded),  # occurred more than a day from publication
            "p50_s": _round(row.occurred_p50),
            "p99_s": _round(row.occurred_p99),
        },
        "since_published": {
            "events": int(row.n_published),
            "p50_s": _round(row.published_p50),
            "p99_s": _round(row.published_p99),
        },
    }


async def dead_letters_by_reason(conn: AsyncConnection) -> dict[str, int]:
    """Dead letters not yet replayed, by reason (the most frequent first)."""
    return {str(r.reason): int(r.n) for r in (await conn.execute(_DEAD_LETTERS)).all()}


async def snapshot_history(conn: AsyncConnection, n: int = SNAPSHOT_HISTORY) -> list[Any]:
    """The newest ``n`` snapshot rows (retention keeps KGSTREAM_SNAPSHOTS_KEEP of them, plus
    failed ones until the next publish): status, when the recompute started (``created_at``),
    when it published, and how long it took (None unless it published)."""
    rows = (await conn.execute(_SNAPSHOTS, {"n": n})).all()
    return [
        {
            "id": int(r.id),
            "status": str(r.status),
            "created_at": r.created_at.isoformat(),
            "published_at": None if r.published_at is None else r.published_at.isoformat(),
            "recompute_s": _round(r.recompute_s),
            "nodes": int(r.nodes),
            "edges": int(r.edges),
            "communities": int(r.communities),
            "levels": int(r.levels),
        }
        for r in rows
    ]


async def token_use(conn: AsyncConnection) -> list[dict[str, Any]]:
    """Tokens the model endpoints reported, by purpose and model, since the start."""
    return [
        {
            "purpose": str(r.purpose),
            "model": str(r.model),
            "prompt_tokens": int(r.prompt),
            "completion_tokens": int(r.completion),
            "rows": int(r.rows),
        }
        for r in (await conn.execute(_TOKENS)).all()
    ]


async def activity(
    conn: AsyncConnection, *, change_ratio: float, threshold: float, freshness_window_s: float
) -> dict[str, Any]:
    """Everything above as the status document's added keys."""
    return {
        "throughput": await throughput(conn),
        "freshness": await freshness(conn, freshness_window_s),
        "dead_letters_by_reason": await dead_letters_by_reason(conn),
        "change": {
            "ratio": round(change_ratio, 6),
            "threshold": threshold,
            "over_threshold": change_ratio > threshold,
        },
        "snapshots": await snapshot_history(conn),
        "tokens": await token_use(conn),
    }
