"""Time grid, rates and histogram quantiles behind status and the dashboard."""

from __future__ import annotations

import math

import pytest

from services.core.series import (
    bucket_delta,
    chart,
    grid,
    histogram_quantile,
    on_grid,
    per_second,
    points,
)

INF = math.inf


def test_grid_ends_at_the_bucket_now_falls_in() -> None:
    assert grid(now=1000.0, window_s=180, step_s=60) == [840.0, 900.0, 960.0]
    assert grid(now=960.0, window_s=60, step_s=60) == [960.0]


def test_on_grid_fills_gaps_with_zero_for_counts_and_none_for_measures() -> None:
    times = [0.0, 60.0, 120.0]
    assert on_grid(times, {60.0: 4.0}, 0.0) == [0.0, 4.0, 0.0]
    assert on_grid(times, {60.0: 1.5}, None) == [None, 1.5, None]


def test_per_second_divides_the_filling_bucket_by_its_elapsed_time() -> None:
    times = [0.0, 60.0, 120.0]
    rates = per_second(times, [60.0, None, 30.0], step_s=60, now=135.0)
    assert rates == [1.0, None, 2.0]  # the last bucket has run 15 s
    # A bucket that has just opened is divided by at least one second.
    assert per_second([120.0], [3.0], step_s=60, now=120.2) == [3.0]


def test_quantile_interpolates_inside_its_bucket_like_prometheus() -> None:
    buckets = [(0.1, 5.0), (0.2, 10.0), (INF, 10.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.1 + 0.1 * 4.9 / 5)
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.05)


def test_quantile_in_the_inf_bucket_is_the_largest_finite_bound() -> None:
    assert histogram_quantile(0.99, [(0.1, 1.0), (0.5, 1.0), (INF, 50.0)]) == 0.5


def test_quantile_of_nothing_is_none_and_bad_quantiles_are_refused() -> None:
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]) is None
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        histogram_quantile(1.5, [(INF, 1.0)])


def test_bucket_delta_counts_what_happened_between_readings() -> None:
    old = [(0.1, 2.0), (INF, 3.0)]
    new = [(0.1, 5.0), (INF, 9.0)]
    assert bucket_delta(new, old) == [(0.1, 3.0), (INF, 6.0)]
    assert bucket_delta(new, None) == new
    # A restarted process resets its counters: count from zero, never negative.
    assert bucket_delta(old, new) == old


def test_chart_shape_and_points_count_non_null_values() -> None:
    c = chart("s", [60.0, 120.0], {"a": [1.0, None], "b": [0.1234567891, 2.0]})
    assert c == {
        "unit": "s",
        "t": [60.0, 120.0],
        "series": [
            {"name": "a", "values": [1.0, None]},
            {"name": "b", "values": [0.123457, 2.0]},
        ],
    }
    assert points(c) == 3
    assert points(chart("s", [], {})) == 0
