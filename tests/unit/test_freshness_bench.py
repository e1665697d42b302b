"""bench/_freshness.py: the freshness benchmark's schedule, marked documents, percentiles and
breakdown of parts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # as the benches run

import _freshness as fr

EVENT = {"event_id": "e1", "type": "upsert", "doc_id": "d1", "title": "Ada", "text": "Ada wrote."}


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert fr.percentile(values, 50) == 50.0
    assert fr.percentile(values, 99) == 99.0
    assert fr.percentile(values, 100) == 100.0
    assert fr.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert fr.percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        fr.percentile([], 50)


def test_summary_of_values_and_of_none() -> None:
    assert fr.summary([1.0, 2.0, 3.0, 10.0]) == {
        "n": 4,
        "p50": 2.0,
        "p99": 10.0,
        "max": 10.0,
        "mean": 4.0,
    }
    assert fr.summary([]) == {}


def test_a_steady_schedule_and_enough_documents_for_it() -> None:
    assert [fr.due(100.0, 4.0, i) for i in range(3)] == [100.0, 100.25, 100.5]
    n = fr.count_for(5.2, 120)
    assert fr.due(0.0, 5.2, n - 1) >= 120  # the last one goes out at or after the duration


def test_marked_copies_are_new_documents_findable_by_their_marker() -> None:
    a, b = fr.marked(EVENT, 1, "fresh"), fr.marked(EVENT, 2, "fresh")
    assert {a["event_id"], b["event_id"]} == {"fresh-1", "fresh-2"}
    assert a["doc_id"] == "fresh-1-d1"
    assert a["doc_id"] != b["doc_id"]
    assert a["text"].startswith(fr.marker(1) + ". ")
    assert a["text"].endswith(EVENT["text"])
    assert a["type"] == "upsert"
    assert a["title"] == "Ada"
    assert fr.marker(1) in fr.question(a, 1)
    assert fr.marker(1).isalnum()  # one full-text lexeme
    assert EVENT["doc_id"] == "d1"  # the input is not changed


def test_cycle_wraps_around_the_input() -> None:
    assert fr.cycle([1, 2, 3], 5, offset=2) == [3, 1, 2, 3, 1]
    with pytest.raises(ValueError, match="no events"):
        fr.cycle([], 1)


def test_breakdown_and_the_slowest_share() -> None:
    parts = {
        "a": {"batch": 0.1, "write": 0.2},
        "b": {"batch": 0.3, "write": 0.4},
        "c": {"write": 2.0},
    }
    out = fr.breakdown(parts.values(), ["batch", "write", "poll"])
    assert out["batch"]["n"] == 2
    assert out["write"]["max"] == 2.0
    assert out["poll"] == {}
    latency = {"a": 0.5, "b": 0.9, "c": 3.0, "x": 9.0}  # x has no parts: skipped
    assert fr.slowest_share(latency, parts, 0.01) == {"write": 2.0, "events": 1}
    two = fr.slowest_share(latency, parts, 0.5)
    assert two == {"batch": 0.15, "write": 1.2, "events": 2}
