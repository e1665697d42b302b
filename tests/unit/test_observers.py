"""The observers behind the metrics: each figure a handler reports lands in the catalogue's
metric with the catalogue's labels; model calls are metered at the call sites."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import get_args

import pytest
from prometheus_client import REGISTRY

from services.communities.metrics import PrometheusCommunitiesObserver, show_snapshot
from services.communities.snapshots import PublishedState
from services.core.extraction import Extraction, TokenUsage
from services.core.model_meter import ModelMeter, embed_metered, extract_metered
from services.indexer.deps import Outcome
from services.indexer.metrics import OUTCOME_LABELS, PrometheusIndexerObserver
from services.indexer.observer import IndexerObserver, Since, Stage, observe_freshness, timed
from tests.support.metrics_text import CATALOGUE


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_every_outcome_maps_to_a_catalogued_label() -> None:
    assert set(OUTCOME_LABELS) == set(get_args(Outcome))
    row = next(
        line
        for line in CATALOGUE.read_text().splitlines()
        if "kgstream_indexer_events_total" in line
    )
    labels_cell = re.split(r"(?<!\\)\|", row)[3]  # cells split on unescaped pipes
    documented = [v.strip() for v in labels_cell.split("=")[1].split("\\|")]
    assert sorted(OUTCOME_LABELS.values()) == sorted(documented)


def test_indexer_observer_counts_into_the_catalogue_metrics() -> None:
    observer = PrometheusIndexerObserver()
    before = value("kgstream_indexer_events_total", outcome="skipped_stale")
    observer.outcome("stale")
    assert value("kgstream_indexer_events_total", outcome="skipped_stale") == before + 1

    before = value("kgstream_indexer_dead_letters_total", reason="schema")
    observer.dead_letter("schema")
    assert value("kgstream_indexer_dead_letters_total", reason="schema") == before + 1

    before = value("kgstream_indexer_batch_size_count")
    observer.batch(5)
    assert value("kgstream_indexer_batch_size_count") == before + 1

    before = value("kgstream_indexer_stage_seconds_sum", stage="embed")
    observer.stage("embed", 0.25)
    assert value("kgstream_indexer_stage_seconds_sum", stage="embed") == before + 0.25

    before = value("kgstream_indexer_freshness_seconds_count", since="published")
    observer.freshness("published", 3.0)
    assert value("kgstream_indexer_freshness_seconds_count", since="published") == before + 1

    reused = value("kgstream_indexer_chunks_total", result="reused")
    embedded = value("kgstream_indexer_chunks_total", result="embedded")
    observer.chunks(reused=4, embedded=2)
    assert value("kgstream_indexer_chunks_total", result="reused") == reused + 4
    assert value("kgstream_indexer_chunks_total", result="embedded") == embedded + 2

    before = value("kgstream_indexer_transient_retries_total")
    observer.transient_retry()
    assert value("kgstream_indexer_transient_retries_total") == before + 1


class Recorder(IndexerObserver):
    def __init__(self) -> None:
        self.stages: list[tuple[Stage, float]] = []
        self.calls: list[tuple[str, str, int, int, int, int]] = []

    def stage(self, stage: Stage, seconds: float) -> None:
        self.stages.append((stage, seconds))

    def model_call(
        self,
        purpose: str,
        model: str,
        *,
        inputs: int,
        calls: int = 1,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        self.calls.append((purpose, model, inputs, calls, prompt_tokens, completion_tokens))


def test_timed_reports_a_stage_also_when_it_fails() -> None:
    recorder = Recorder()
    with timed(recorder, "write"):
        pass
    with pytest.raises(RuntimeError), timed(recorder, "extract"):
        raise RuntimeError("boom")
    assert [s for s, _ in recorder.stages] == ["write", "extract"]
    assert all(seconds >= 0 for _, seconds in recorder.stages)


class OfflineEmbedder:
    dim, model_id = 2, "offline-model"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [[1.0, 0.0] for _ in texts]


class EndpointEmbedder(OfflineEmbedder):
    model_id = "endpoint-model"

    def embed_with_usage(self, texts: Sequence[str]) -> tuple[list[list[float]], int]:
        return self.embed(texts), 7 * len(texts)


def test_embeddings_are_metered_with_tokens_where_the_endpoint_reports_them() -> None:
    recorder = Recorder()
    assert (
        embed_metered(OfflineEmbedder(), recorder, "embed_chunks", ["a", "b"]) == [[1.0, 0.0]] * 2
    )
    assert len(embed_metered(EndpointEmbedder(), recorder, "embed_query", ["q"])) == 1
    assert recorder.calls == [
        ("embed_chunks", "offline-model", 2, 1, 0, 0),
        ("embed_query", "endpoint-model", 1, 1, 7, 0),
    ]


class LLMExtractor:
    name = "openai:chat"

    def extract(self, texts: Sequence[str]) -> list[Extraction]:
        return [Extraction([], [], TokenUsage("chat", 10, 3, 2)) for _ in texts]


class OfflineExtractor:
    name = "spacy:sm"

    def extract(self, texts: Sequence[str]) -> list[Extraction]:
        return [Extraction([], []) for _ in texts]


def test_extraction_is_metered_by_its_usage_or_one_call_per_batch() -> None:
    recorder = Recorder()
    extract_metered(LLMExtractor(), recorder, ["x", "y", "z"])
    extract_metered(OfflineExtractor(), recorder, ["x", "y"])
    assert recorder.calls == [
        ("extract", "chat", 3, 6, 30, 9),
        ("extract", "spacy:sm", 2, 1, 0, 0),
    ]


def test_the_base_meter_counts_nothing() -> None:
    ModelMeter().model_call("answer", "m", inputs=1, prompt_tokens=5)  # returns, records nothing
    assert value("kgstream_model_calls_total", purpose="answer", model="m") == 0.0


def test_prometheus_meter_counts_calls_inputs_and_tokens() -> None:
    observer = PrometheusIndexerObserver()  # a ModelMeter too
    observer.model_call("adjudicate", "unit-model", inputs=2, prompt_tokens=11, completion_tokens=1)
    labels = {"purpose": "adjudicate", "model": "unit-model"}
    assert value("kgstream_model_calls_total", **labels) >= 1
    assert value("kgstream_model_inputs_total", **labels) >= 2
    assert value("kgstream_model_tokens_total", **labels, kind="prompt") >= 11
    assert value("kgstream_model_tokens_total", **labels, kind="completion") >= 1


def test_communities_observer_and_snapshot_gauges() -> None:
    observer = PrometheusCommunitiesObserver()
    before = value("kgstream_communities_checks_total", decision="locked")
    observer.check("locked")
    assert value("kgstream_communities_checks_total", decision="locked") == before + 1
    observer.change(0.25, 0.1)
    assert value("kgstream_communities_change_ratio") == 0.25
    assert value("kgstream_communities_change_threshold") == 0.1
    observer.withheld(4)
    assert value("kgstream_communities_withheld") == 4
    before = value("kgstream_communities_recompute_seconds_count", phase="leiden")
    observer.phase("leiden", 1.5)
    assert value("kgstream_communities_recompute_seconds_count", phase="leiden") == before + 1
    before = value("kgstream_communities_reports_total", result="generated")
    observer.reports(reused=0, generated=3)
    assert value("kgstream_communities_reports_total", result="generated") == before + 3

    published = datetime.now(UTC) - timedelta(minutes=5)
    show_snapshot(PublishedState(42, published, {0: 7, 1: 2}))
    assert value("kgstream_communities_snapshot_id") == 42
    assert value("kgstream_communities_snapshot_published_timestamp_seconds") == (
        published.timestamp()
    )
    assert 300 <= value("kgstream_communities_snapshot_age_seconds") < 3600  # computed at scrape
    assert value("kgstream_communities_by_level", level="1") == 2
    show_snapshot(PublishedState(43, published, {0: 5}))
    assert REGISTRY.get_sample_value("kgstream_communities_by_level", {"level": "1"}) is None
    show_snapshot(None)
    assert value("kgstream_communities_snapshot_id") == 0
    assert value("kgstream_communities_snapshot_age_seconds") == 0


class FreshnessRecorder(IndexerObserver):
    def __init__(self) -> None:
        self.seen: list[tuple[Since, float]] = []

    def freshness(self, since: Since, seconds: float) -> None:
        self.seen.append((since, seconds))


@pytest.mark.parametrize(
    "occurred_at",
    [
        datetime(1, 1, 1, tzinfo=UTC),  # year 0001: ~6e10 s before now
        datetime(9999, 1, 1, tzinfo=UTC),
        datetime(2026, 1, 1, tzinfo=UTC) - timedelta(days=2),  # a back-fill
    ],
)
def test_freshness_since_occurrence_leaves_out_implausible_clocks(occurred_at: datetime) -> None:
    # The same rule as the status's figures (OCCURRED_PLAUSIBLE): within a day of publication.
    now = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    observer = FreshnessRecorder()
    observe_freshness(observer, occurred_at, now - 2.0, now)
    assert observer.seen == [("published", 2.0)]


def test_freshness_since_occurrence_counts_plausible_clocks() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    occurred = datetime.fromtimestamp(now - 5.0, UTC)
    observer = FreshnessRecorder()
    observe_freshness(observer, occurred, now - 2.0, now)
    assert observer.seen == [("occurred", 5.0), ("published", 2.0)]
    observer = FreshnessRecorder()
    observe_freshness(observer, occurred, None, now)  # no record timestamp: the commit's time
    assert observer.seen == [("occurred", 5.0)]
