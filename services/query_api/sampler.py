"""The dashboard's memory of things the database keeps no history of: indexer lag, the change
ratio, and this API process's query latency by mode. Every few seconds (KGSTREAM_DASHBOARD_
SAMPLE_S) a sample is appended to a ring buffer that holds KGSTREAM_DASHBOARD_WINDOW_S of them;
it is per process and starts empty when the process starts.

Query latency comes from the process's own ``kgstream_query_seconds`` histogram: each sample
keeps the cumulative buckets per mode, and a point's p50/p99 are read from the observations
between it and the sample ``latency_window_s`` earlier (the way Prometheus' ``rate`` +
``histogram_quantile`` would), so a point shows the last minute, not the process's lifetime."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from services.core.series import Buckets, bucket_delta, chart, histogram_quantile

log = logging.getLogger(__name__)

LATENCY_METRIC = "kgstream_query_seconds"
QUANTILES = (("p50", 0.5), ("p99", 0.99))


@dataclass(frozen=True)
class Probe:
    """What one sample reads outside this process: lag per consumer group (None: the broker
    gave no end offsets) and the change ratio."""

    lag: dict[str, int | None]
    change_ratio: float | None


@dataclass(frozen=True)
class Sample:
    t: float
    lag: dict[str, int | None]
    change_ratio: float | None
    latency: dict[str, Buckets] = field(default_factory=dict)  # mode -> cumulative buckets


def read_histogram(registry: CollectorRegistry, name: str = LATENCY_METRIC) -> dict[str, Buckets]:
    """Cumulative (le, count) buckets per ``mode`` label of the histogram ``name``."""
    found: dict[str, list[tuple[float, float]]] = {}
    for metric in registry.collect():
        if metric.name != name:
            continue
        for s in metric.samples:
            if s.name == f"{name}_bucket":
                found.setdefault(s.labels["mode"], []).append((float(s.labels["le"]), s.value))
    return {mode: sorted(b) for mode, b in found.items()}


def latency_series(
    samples: Sequence[Sample], baseline: dict[str, Buckets], window_s: float
) -> dict[str, list[float | None]]:
    """``{mode} p50`` and ``{mode} p99`` per sample over the observations of the preceding
    ``window_s`` seconds (before the first sample that old: since ``baseline``, the
    histogram when sampling began); None where a mode answered nothing in that window."""
    modes = sorted({m for s in samples for m in s.latency})
    out: dict[str, list[float | None]] = {f"{m} {q}": [] for m in modes for q, _ in QUANTILES}
    ref = 0  # index of the newest sample at least window_s older than the current one
    for i, s in enumerate(samples):
        while ref + 1 < i and samples[ref + 1].t <= s.t - window_s:
            ref += 1
        old = samples[ref].latency if samples[ref].t <= s.t - window_s else baseline
        for m in modes:
            delta = bucket_delta(s.latency.get(m, []), old.get(m))
            for q, value in QUANTILES:
                out[f"{m} {q}"].append(histogram_quantile(value, delta))
    return out


class Sampler:
    """Samples every ``interval_s`` into a ring buffer covering ``window_s``."""

    def __init__(
        self,
        probe: Callable[[], Awaitable[Probe]],
        *,
        interval_s: float,
        window_s: float,
        registry: CollectorRegistry = REGISTRY,
        latency_window_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.probe, self.interval_s, self.registry = probe, interval_s, registry
        self.latency_window_s, self.clock = latency_window_s, clock
        self.samples: deque[Sample] = deque(maxlen=math.ceil(window_s / interval_s) + 1)
        self.baseline = read_histogram(registry)
        self._failing = False

    async def sample(self) -> Sample:
        """Take one sample now; a failed probe is logged (once per failure streak) and gives a
        sample with no lag and no change ratio, so the chart shows a gap, not stale values."""
        try:
            probe = await self.probe()
            self._failing = False
        except Exception as exc:  # noqa: BLE001 - the dashboard shows a gap; the API serves on
            if not self._failing:
                log.warning("dashboard sample failed (a gap in lag and change ratio): %s", exc)
            self._failing = True
            probe = Probe({}, None)
        taken = Sample(self.clock(), probe.lag, probe.change_ratio, read_histogram(self.registry))
        self.samples.append(taken)
        return taken

    async def run(self) -> None:
        """Sample until cancelled."""
        while True:
            await self.sample()
            await asyncio.sleep(self.interval_s)

    def charts(self, threshold: float) -> dict[str, dict[str, Any]]:
        """lag, change_ratio (with the threshold as a second series) and query_latency."""
        samples = list(self.samples)
        times = [s.t for s in samples]
        groups = sorted({g for s in samples for g in s.lag})
        lag = {f"lag {g}": [_as_float(s.lag.get(g)) for s in samples] for g in groups}
        ratio: dict[str, list[float | None]] = {
            "change ratio": [s.change_ratio for s in samples],
            "threshold": [threshold for _ in samples],
        }
        latency = latency_series(samples, self.baseline, self.latency_window_s)
        return {
            "lag": chart("records", times, lag),
            "change_ratio": chart("ratio", times, ratio),
            "query_latency": chart("s", times, latency),
        }


def _as_float(value: int | None) -> float | None:
    return None if value is None else float(value)
