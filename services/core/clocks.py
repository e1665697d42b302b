"""The clock rule shared by the indexer (ordering events) and HTTP ingest (stamping deletes):
an ``occurred_at`` far ahead of a trusted reference time comes from a broken clock
(docs/ingest.md, "Ordering and clocks")."""

from __future__ import annotations

from datetime import datetime, timedelta


def bounded_time(occurred_at: datetime, reference: datetime, max_skew: timedelta) -> datetime:
    """The time to order by: ``occurred_at``, unless it is more than ``max_skew`` ahead of
    ``reference``; then ``reference`` itself (the clock is wrong, not early). The past is
    left as stated: an event that claims to be old only loses."""
    return reference if occurred_at > reference + max_skew else occurred_at
