"""docs/metrics.md is the contract: every metric in its tables is registered by the code, with
the type and labels it names, and every kgstream_* metric the code registers is in the tables."""

from __future__ import annotations

import importlib

from prometheus_client import REGISTRY, Counter
from prometheus_client.metrics import MetricWrapperBase

from tests.support.metrics_text import catalogue

# Every module that defines metrics: importing them registers their metrics.
METRIC_MODULES = (
    "services.core.telemetry.build",
    "services.core.telemetry.pool",
    "services.core.telemetry.models",
    "services.indexer.metrics",
    "services.communities.metrics",
    "services.query_api.metrics",
)
# Collectors that are not metric objects in a module: their labels, as they export them.
COLLECTOR_LABELS = {"kgstream_db_pool_connections": frozenset({"state"})}


def registered() -> dict[str, str]:
    """name -> type of every metric family in the default registry (counters with _total)."""
    for module in METRIC_MODULES:
        importlib.import_module(module)
    found = {}
    for family in REGISTRY.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        found[name] = family.type
    return found


def registered_labels() -> dict[str, frozenset[str]]:
    """name -> label names of every kgstream metric object the metric modules define."""
    found = dict(COLLECTOR_LABELS)
    for module in METRIC_MODULES:
        for value in vars(importlib.import_module(module)).values():
            if isinstance(value, MetricWrapperBase):
                attrs = vars(value)  # prometheus-client keeps both privately
                name = attrs["_name"] + ("_total" if isinstance(value, Counter) else "")
                found[name] = frozenset(attrs["_labelnames"])
    return found


def test_the_catalogue_lists_metrics() -> None:
    names = catalogue()
    assert len(names) >= 30
    assert names["kgstream_indexer_events_total"] == ("counter", frozenset({"outcome"}))
    assert names["process_start_time_seconds"] == ("gauge", frozenset())


def test_every_catalogued_metric_is_registered_with_its_type() -> None:
    code = registered()
    missing = {n: t for n, (t, _) in catalogue().items() if n not in code}
    assert not missing, f"in docs/metrics.md but not registered: {missing}"
    wrong = {n: (t, code[n]) for n, (t, _) in catalogue().items() if code[n] != t}
    assert not wrong, f"(documented, registered) types differ: {wrong}"


def test_every_kgstream_metric_has_the_catalogued_labels() -> None:
    code = registered_labels()
    documented = {n: labels for n, (_, labels) in catalogue().items() if n.startswith("kgstream_")}
    assert set(documented) <= set(code)
    wrong = {n: (sorted(ls), sorted(code[n])) for n, ls in documented.items() if code[n] != ls}
    assert not wrong, f"(documented, registered) labels differ: {wrong}"


def test_every_kgstream_metric_is_catalogued() -> None:
    documented = catalogue()
    extra = sorted(n for n in registered() if n.startswith("kgstream_") and n not in documented)
    assert not extra, f"registered but not in docs/metrics.md: {extra}"
