"""The freshness benchmark's pure parts (bench/bench_freshness.py): the publish schedule, the
marked copies of events that make each document findable by one query, percentiles and the
breakdown of published → answerable into its parts. No I/O here."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from services.eval import metrics as eval_metrics

T = TypeVar("T")

MARK = "kgfresh"


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q ≤ 100) of ``values`` (not empty: an empty
    list is an error here, where eval's ``percentile`` reports 0)."""
    if not values:
        raise ValueError("no values")
    return eval_metrics.percentile(values, q)


def summary(values: Sequence[float]) -> dict[str, float]:
    """n, p50, p99, max and mean (seconds, to the millisecond); empty for no values."""
    if not values:
        return {}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 3),
        "p99": round(percentile(values, 99), 3),
        "max": round(max(values), 3),
        "mean": round(sum(values) / len(values), 3),
    }


def due(start: float, rate: float, i: int) -> float:
    """When the ``i``-th publish (from 0) is due at a steady ``rate`` per second."""
    return start + i / rate


def count_for(rate: float, seconds: float) -> int:
    """Documents needed to publish at ``rate`` for at least ``seconds``."""
    return math.ceil(rate * seconds) + 1


def marker(i: int) -> str:
    """A word found in no other document (one full-text lexeme: letters and digits)."""
    return f"{MARK}{i:06d}x"


def marked(event: Mapping[str, Any], i: int, prefix: str) -> dict[str, Any]:
    """A new document from ``event``: its own doc_id and event_id, and ``marker(i)`` as the
    first word of its text, so a query for the marker finds this document and no other."""
    return {
        **event,
        "event_id": f"{prefix}-{i}",
        "doc_id": f"{prefix}-{i}-{event['doc_id']}",
        "text": f"{marker(i)}. {event['text']}",
    }


def question(event: Mapping[str, Any], i: int) -> str:
    """The query that must return the ``i``-th marked document: its title and its marker."""
    return f"{event['title']} {marker(i)}"


def cycle(events: Sequence[T], n: int, offset: int = 0) -> list[T]:
    """``n`` events taken in order from ``offset`` on, wrapping around (not empty)."""
    if not events:
        raise ValueError("no events")
    return [events[(offset + i) % len(events)] for i in range(n)]


def breakdown(
    per_event: Iterable[Mapping[str, float]], names: Sequence[str]
) -> dict[str, dict[str, float]]:
    """Per part name: the summary of that part over the events that have it."""
    rows = list(per_event)
    return {name: summary([r[name] for r in rows if name in r]) for name in names}


def slowest_share(
    latencies: Mapping[str, float], parts: Mapping[str, Mapping[str, float]], share: float
) -> dict[str, float]:
    """The mean of each part over the slowest ``share`` of events (at least one), by total
    latency; events without parts are skipped."""
    ranked = sorted((k for k in latencies if k in parts), key=lambda k: -latencies[k])
    top = ranked[: max(1, math.ceil(share * len(ranked)))] if ranked else []
    names = sorted({n for k in top for n in parts[k]})
    return {n: round(sum(parts[k].get(n, 0.0) for k in top) / len(top), 3) for n in names} | {
        "events": len(top)
    }
