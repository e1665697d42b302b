"""Issue 18 ("Smaller"): one event with ``occurred_at`` in year 0001 pushed the status's
``since_occurred`` p99 to 49 billion seconds for the whole 10-minute window (and the
dashboard's chart with it). Freshness since occurrence now leaves out events whose occurred_at
is more than a day away from their publication (back-fills and broken clocks) and counts them."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from services.core.activity import freshness
from services.core.db.engine import make_engine
from services.core.history import history

pytestmark = pytest.mark.integration
GOOD = 20


async def test_absurd_occurred_at_values_leave_freshness_alone(database_url: str) -> None:
    """Failed on 4163b39: p99 since occurred was ~6e10 s (year 0001) and the dashboard's too."""
    engine = make_engine(database_url)
    try:
        async with engine.begin() as conn:
            # Twenty events that occurred 2 s before they were published, committed 0.5 s later.
            await conn.execute(
                text(
                    "INSERT INTO processed_events"
                    " (event_id, doc_id, outcome, occurred_at, published_at, processed_at)"
                    " SELECT 'ok-' || i, 'd' || i, 'applied', now() - interval '2.5 s',"
                    " now() - interval '0.5 s', now() FROM generate_series(1, :n) i"
                ),
                {"n": GOOD},
            )
            # A clock in year 1 and one in year 9999 (a row written before the bound).
            await conn.execute(
                text(
                    "INSERT INTO processed_events"
                    " (event_id, doc_id, outcome, occurred_at, published_at, processed_at)"
                    " VALUES ('past', 'p', 'applied', '0001-01-01T00:00:00Z', now(), now()),"
                    " ('future', 'f', 'deleted', '9999-12-31T00:00:00Z', now(), now())"
                )
            )
        async with engine.connect() as conn:
            fresh = await freshness(conn, 600)
            charts = await history(conn, 600, 60)
    finally:
        await engine.dispose()
    occurred = fresh["since_occurred"]
    assert occurred["events"] == GOOD
    assert occurred["excluded"] == 2
    assert occurred["p99_s"] is not None
    assert 2 <= occurred["p50_s"] <= occurred["p99_s"] < 10
    assert fresh["since_published"]["events"] == GOOD + 2
    series = {s["name"]: s["values"] for s in charts["freshness"]["series"]}
    p99 = [v for v in series["p99 since occurred"] if v is not None]
    assert p99
    assert max(p99) < 10
