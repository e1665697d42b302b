"""Reading Prometheus figures: docs/metrics.md's tables, and samples from exposition text."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

CATALOGUE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
_ROW = re.compile(r"^\|\s*`([a-z_]+)`\s*\|\s*([a-z]+)[^|]*\|([^|]*)\|")
_LABEL = re.compile(r"`([a-z_]+)`")


def catalogue() -> dict[str, tuple[str, frozenset[str]]]:
    """metric name -> (type, label names) from the tables of docs/metrics.md."""
    found = {}
    for line in CATALOGUE.read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line)
        if match:
            labels = frozenset(_LABEL.findall(match.group(3)))
            found[match.group(1)] = (match.group(2), labels)
    return found


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(sample name, labels) -> value of every sample in exposition text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples(text).items() if n == name and wanted <= ls)
