"""services/indexer/event_times.py: the parts of published → committed add up, a missing
instant folds its part into the next, and the logged form reads back."""

from __future__ import annotations

import pytest

from services.indexer.event_times import PARTS, EventTimes, parse_parts, wall_from_monotonic


def times(published: float | None = 100.0, received: float | None = 100.01) -> EventTimes:
    return EventTimes(
        published=published,
        received=received,
        compute_started=100.06,
        compute_ended=100.26,
        write_started=100.30,
        committed=100.37,
    )


def test_the_parts_follow_each_other_and_add_up_to_publish_to_commit() -> None:
    parts = times().parts()
    assert list(parts) == list(PARTS)
    assert parts == pytest.approx(
        {"consumer": 0.01, "batch": 0.05, "compute": 0.20, "queue": 0.04, "write": 0.07}
    )
    assert sum(parts.values()) == pytest.approx(0.37)


def test_an_unknown_instant_leaves_its_part_out() -> None:
    no_timestamp = times(published=None).parts()
    assert "consumer" not in no_timestamp
    assert no_timestamp["batch"] == pytest.approx(0.05)
    not_stamped = times(received=None).parts()
    assert "consumer" not in not_stamped
    assert "batch" not in not_stamped
    assert not_stamped["compute"] == pytest.approx(0.20)


def test_the_logged_parts_read_back() -> None:
    line = f"upsert applied ({times().describe()})"
    assert parse_parts(line) == pytest.approx(times().parts(), abs=1e-4)
    assert parse_parts("upsert applied (other=1 batch=x)") == {}


def test_a_monotonic_instant_maps_to_the_wall_clock() -> None:
    assert wall_from_monotonic(40.0, now_wall=1_000.0, now_monotonic=50.0) == 990.0
