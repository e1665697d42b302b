"""`kgstream review sample` and `kgstream review score` as an operator runs them, on the indexed
sample corpus (read only): a seeded draw is repeatable, every item carries the mentions a
person judges, and the figures follow the verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.core.settings import Settings
from tests.conftest import Infra
from tests.support.cli import kgstream

pytestmark = pytest.mark.integration


@pytest.fixture
def on_sample(infra: Infra, sample_db: str) -> Settings:
    return Settings(
        home=infra.home, database_url=sample_db, kafka_bootstrap_servers=infra.bootstrap
    )


def _judged(items: list[dict[str, object]], label: str, path: Path) -> Path:
    path.write_text("".join(json.dumps({**i, "label": label}) + "\n" for i in items))
    return path


def test_sample_then_score(on_sample: Settings, tmp_path: Path) -> None:
    drawn = tmp_path / "drawn.jsonl"
    first = kgstream(on_sample, "review", "sample", "40", "--seed", "3", "--out", str(drawn))
    assert first.returncode == 0, first.stderr
    items = [json.loads(line) for line in drawn.read_text().splitlines()]
    assert f"{len(items)} item(s); written to {drawn}" in first.stdout
    assert any(i["kind"] == "candidate" for i in items)
    for item in items:
        for side in (item["a"], item["b"]):
            assert side["entity"]
            assert side["contexts"]
            for context in side["contexts"]:
                assert context["surface"] in context["sentence"]
    again = kgstream(on_sample, "review", "sample", "40", "--seed", "3", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == items  # a seeded draw is repeatable

    kinds = {k: sum(i["kind"] == k for i in items) for k in ("candidate", "merged")}
    different = kgstream(
        on_sample, "review", "score", str(_judged(items, "different", tmp_path / "d.jsonl")),
        "--json",
    )  # fmt: skip
    assert different.returncode == 0, different.stderr
    report = json.loads(different.stdout)
    # every merge is judged wrong and is still merged; no pair kept apart was merged
    assert report["false_merge_rate"]["hits"] == kinds["merged"]
    assert report["merges_made_of_distinct_pairs"]["hits"] == 0
    assert report["duplicate_rate"] == {
        **report["duplicate_rate"],
        "hits": 0,
        "of": kinds["candidate"],
    }
    same = kgstream(on_sample, "review", "score", str(_judged(items, "same", tmp_path / "s.jsonl")))
    assert same.returncode == 0, same.stderr
    n = kinds["candidate"]
    assert f"duplicate rate: 100.0% ({n} of {n};" in same.stdout  # every pair is kept apart


def test_a_bad_verdict_is_named_with_its_line(on_sample: Settings, tmp_path: Path) -> None:
    judged = tmp_path / "bad.jsonl"
    side = {"contexts": [{"doc_id": "d", "surface": "x"}]}
    good = {"kind": "candidate", "a": side, "b": side, "label": "same"}
    judged.write_text(json.dumps(good) + "\n" + json.dumps({**good, "label": "maybe"}) + "\n")
    result = kgstream(on_sample, "review", "score", str(judged))
    assert result.returncode == 2
    assert f"{judged}:2: label must be one of same, different, unsure" in result.stderr
