"""The query API's in-memory sampler: ring buffer, gaps on failure, latency p50/p99 per mode
from the process's own histogram over a sliding window."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram

from services.core.series import points
from services.query_api.sampler import Probe, Sample, Sampler, latency_series, read_histogram

INF = math.inf


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        "kgstream_query_seconds", "q", ["mode"], buckets=(0.1, 0.2, 0.5), registry=registry
    )


def test_read_histogram_gives_cumulative_buckets_per_mode(registry: CollectorRegistry) -> None:
    h = histogram(registry)
    h.labels(mode="vector").observe(0.15)
    h.labels(mode="vector").observe(0.05)
    assert read_histogram(registry) == {"vector": [(0.1, 1.0), (0.2, 2.0), (0.5, 2.0), (INF, 2.0)]}


def b(fast: float, slow: float) -> list[tuple[float, float]]:
    """Cumulative buckets with ``fast`` observations under 0.1 s and ``slow`` in (0.1, 1]."""
    return [(0.1, fast), (1.0, fast + slow), (INF, fast + slow)]


def test_latency_uses_only_the_preceding_window() -> None:
    samples = [
        Sample(0.0, {}, None, {"local": b(10, 0)}),
        Sample(30.0, {}, None, {"local": b(10, 0)}),
        Sample(60.0, {}, None, {"local": b(10, 10)}),  # 10 slow queries in (0, 60]
        Sample(130.0, {}, None, {"local": b(10, 10)}),  # none since 60 s
    ]
    series = latency_series(samples, baseline={}, window_s=60)
    p50 = series["local p50"]
    # Until a sample is a window old, the reference is the baseline (nothing observed).
    assert p50[:2] == [pytest.approx(0.05), pytest.approx(0.05)]
    assert p50[2] == pytest.approx(0.55)  # the 10 slow queries in (0.1, 1.0]
    assert p50[3] is None  # nothing answered in the last minute: a gap, not a zero
    assert series["local p99"][2] == pytest.approx(0.1 + 0.9 * 9.9 / 10)  # rank 9.9 of 10


async def test_sampler_ring_buffer_and_charts(registry: CollectorRegistry) -> None:
    h = histogram(registry)
    clock = Clock()
    lag = iter([3, 1, 0, 0])

    async def probe() -> Probe:
        return Probe({"kgstream-indexer": next(lag)}, 0.25)

    sampler = Sampler(probe, interval_s=5, window_s=10, registry=registry, clock=clock)
    h.labels(mode="vector").observe(0.15)  # after the baseline: counted
    for _ in range(4):
        await sampler.sample()
        clock.now += 5
    assert [s.t for s in sampler.samples] == [1005.0, 1010.0, 1015.0]  # 10 s / 5 s + 1 kept
    charts = sampler.charts(threshold=0.1)
    assert charts["lag"]["series"] == [{"name": "lag kgstream-indexer", "values": [1.0, 0.0, 0.0]}]
    assert charts["change_ratio"]["series"][1] == {"name": "threshold", "values": [0.1] * 3}
    assert [s["name"] for s in charts["query_latency"]["series"]] == ["vector p50", "vector p99"]
    assert points(charts["query_latency"]) == 6


async def test_a_failed_probe_is_a_gap(registry: CollectorRegistry) -> None:
    async def probe() -> Probe:
        raise ConnectionError("database gone")

    sampler = Sampler(probe, interval_s=1, window_s=60, registry=registry)
    taken = await sampler.sample()
    assert (taken.lag, taken.change_ratio) == ({}, None)
    charts = sampler.charts(threshold=0.1)
    assert charts["change_ratio"]["series"][0]["values"] == [None]
    assert points(charts["lag"]) == 0
