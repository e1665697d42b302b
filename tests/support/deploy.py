"""Helpers of the deployment-file tests (tests/deploy/): where the files are, YAML loading, and
the metric catalogue (docs/metrics.md) and metric names used in PromQL expressions."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"
K8S = DEPLOY / "k8s"
DOCS = ROOT / "docs"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
# what containers bind to, so that Prometheus and the probes reach them
EVERY_INTERFACE = "0.0.0.0"  # noqa: S104

# a metric name in PromQL or JavaScript: ours, and prometheus-client's process collector
METRIC_NAME = re.compile(r"\b(?:kgstream|process)_[a-z0-9_]+\b")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# a catalogue row: | `name` | type | labels | meaning |
CATALOGUE_ROW = re.compile(r"^\|\s*`([a-z_][a-z0-9_]*)`\s*\|\s*([^|]+?)\s*\|", re.MULTILINE)


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def load_yaml_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def metric_catalogue(text: str | None = None) -> dict[str, str]:
    """Metric name -> type ('counter', 'gauge', 'histogram', ...) from docs/metrics.md."""
    if text is None:
        text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    return {name: kind.split()[0].lower() for name, kind in CATALOGUE_ROW.findall(text)}


def metric_names(expression: str, catalogue: dict[str, str]) -> set[str]:
    """The metric names an expression uses, with a histogram's _bucket/_sum/_count suffix
    stripped (only when what is left is a histogram of the catalogue)."""
    names = set()
    for found in METRIC_NAME.findall(expression):
        name = found
        for suffix in HISTOGRAM_SUFFIXES:
            base = found.removesuffix(suffix)
            if base != found and catalogue.get(base) == "histogram":
                name = base
                break
        names.add(name)
    return names


def markdown_anchors(text: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation dropped, spaces
    to hyphens)."""
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors
