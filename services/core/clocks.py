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


# Freshness since occurrence counts only events that occurred within this much of their
# publication (their commit when the record had no timestamp). Beyond it is a back-fill or a
# broken clock (year 0001, year 9999): one such event would set a p99 to years.
PLAUSIBLE_OCCURRENCE = timedelta(days=1)


def occurred_plausibly(occurred_at: datetime, published: datetime) -> bool:
    """Does ``occurred_at`` lie within ``PLAUSIBLE_OCCURRENCE`` of ``published``? The same
    rule as ``OCCURRED_PLAUSIBLE`` in services/core/activity.py, for the Prometheus figures."""
    return abs(occurred_at - published) <= PLAUSIBLE_OCCURRENCE
