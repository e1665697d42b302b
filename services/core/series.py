"""Time series arithmetic for status and the dashboard, with no I/O: a regular time grid with
gaps filled, rates per second, and quantiles from cumulative histogram buckets (the way
Prometheus' ``histogram_quantile`` reads them)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

Buckets = Sequence[tuple[float, float]]  # (upper bound "le", cumulative count), ascending


def grid(now: float, window_s: float, step_s: float) -> list[float]:
    """Bucket starts (seconds since the epoch, multiples of ``step_s``) covering the last
    ``window_s`` seconds up to and including the bucket ``now`` falls in."""
    last = math.floor(now / step_s) * step_s
    n = max(1, math.ceil(window_s / step_s))
    return [last - (n - 1 - i) * step_s for i in range(n)]


def on_grid(
    times: Sequence[float], values: Mapping[float, float | None], fill: float | None
) -> list[float | None]:
    """The value of each bucket start in ``times``; ``fill`` where a bucket has none (0 for
    counts: nothing happened; None for percentiles: nothing to measure, a gap in the chart)."""
    return [values.get(t, fill) for t in times]


def per_second(
    times: Sequence[float], counts: Sequence[float | None], step_s: float, now: float
) -> list[float | None]:
    """Counts per bucket as a rate per second. The last bucket is still filling: it is divided
    by the seconds it has run so far (at least one), not by the whole step."""
    out: list[float | None] = []
    for t, c in zip(times, counts, strict=True):
        if c is None:
            out.append(None)
            continue
        elapsed = min(step_s, max(1.0, now - t))
        out.append(c / elapsed)
    return out


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The ``q`` quantile (0..1) of observations counted in cumulative ``buckets`` (the last
    one +Inf), interpolated linearly inside the bucket it falls in; None when nothing was
    observed. A quantile in the +Inf bucket is reported as the largest finite bound."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is not within 0..1")
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le, cumulative in buckets:
        if cumulative >= rank and cumulative > below:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * (rank - below) / (cumulative - below)
        if not math.isinf(le):
            lower = le
        below = cumulative
    return lower


def bucket_delta(new: Buckets, old: Buckets | None) -> list[tuple[float, float]]:
    """Observations between two readings of the same cumulative histogram (``old`` None: all
    of ``new``). A counter that went down (the process restarted) counts from zero."""
    if not old:
        return list(new)
    before = dict(old)
    delta = [(le, c - before.get(le, 0.0)) for le, c in new]
    if any(c < 0 for _, c in delta):
        return list(new)
    return delta


def chart(
    unit: str, times: Sequence[float], series: Mapping[str, Sequence[float | None]]
) -> dict[str, Any]:
    """The dashboard's shape for one chart: shared x (seconds since the epoch) and named
    series of the same length, values rounded for the wire."""
    return {
        "unit": unit,
        "t": [round(t, 3) for t in times],
        "series": [
            {"name": name, "values": [None if v is None else round(v, 6) for v in values]}
            for name, values in series.items()
        ],
    }


def points(chart_: Mapping[str, Any]) -> int:
    """Data points a chart holds: values that are not None, over all its series."""
    return sum(v is not None for s in chart_["series"] for v in s["values"])
