"""Report writers without a network: the extractive report, the LLM writer's context budget
and output handling (with a fake client), the report plan, and the binary COPY encoders."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from services.communities.leiden import LeidenConfig
from services.communities.llm_reports import LLMReportWriter
from services.communities.loader import parse_binary_copy
from services.communities.report_plan import plan_reports
from services.communities.reports import (
    ChildSummary,
    EntityFact,
    ExtractiveWriter,
    RelationFact,
    ReportInput,
    extractive_report,
    rating,
)
from services.communities.structure import compute_structure
from services.communities.writer import members_copy
from tests.unit.test_communities_leiden import planted

ITEM = ReportInput(
    community_id=7,
    level=1,
    size=4,
    internal_weight=3.0,
    max_weight=9.0,
    entities=[
        EntityFact("Marie Curie", "PERSON", "Marie Curie was a physicist. She won twice.", 0.4),
        EntityFact("Paris", "GPE", "Marie Curie worked in Paris.", 0.3),
        EntityFact("Pierre Curie", "PERSON", "Pierre Curie was her husband.", 0.2),
        EntityFact("Sorbonne", "ORG", "", 0.1),
    ],
    relations=[RelationFact("Marie Curie", "Paris", "work_in", "She worked in Paris.", 2.0)],
)


def test_extractive_report_is_built_from_the_top_facts() -> None:
    report = extractive_report(ITEM)
    assert report.title == "Marie Curie, Paris and Pierre Curie"
    assert "Marie Curie work in Paris" in report.summary
    assert "Marie Curie was a physicist." in report.summary
    assert report.findings[0].summary == "Marie Curie work in Paris"
    assert 1.0 <= report.rating <= 10.0
    assert report.as_json()["writer"] == ExtractiveWriter.name == "extractive:3"


def test_extractive_report_is_titled_by_its_themes() -> None:
    themes = ("radioactivity", "physicist", "nobel prize", "husband", "laboratory")
    report = extractive_report(ReportInput(**{**ITEM.__dict__, "keyphrases": themes}))
    assert report.title == "Radioactivity, physicist and nobel prize"
    assert report.summary.startswith(
        "Themes: radioactivity, physicist, nobel prize, husband, laboratory. 4 entities around "
        "Marie Curie, Paris and Pierre Curie."
    )
    assert "Marie Curie was a physicist." in report.summary  # the facts stay


def test_rating_scale() -> None:
    assert rating(0.0, 10.0) == 1.0
    assert rating(10.0, 10.0) == 10.0
    assert rating(5.0, 0.0) == 1.0


class FakeCompletions:
    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        self.calls: list[dict[str, Any]] = []

    def create(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        content = self.answers.pop(0)
        message = SimpleNamespace(content=content)
        usage = SimpleNamespace(prompt_tokens=10, completion_tokens=5)
        return SimpleNamespace(choices=[SimpleNamespace(message=message)], usage=usage)


def writer(answers: list[str], budget: int = 1000) -> tuple[LLMReportWriter, FakeCompletions]:
    completions = FakeCompletions(answers)
    client = SimpleNamespace(chat=SimpleNamespace(completions=completions))
    llm = LLMReportWriter(client, "m", input_tokens=(budget,), max_attempts=2, base_delay=0)  # type: ignore[arg-type]
    return llm, completions


def test_llm_report_uses_structured_output_and_children_first() -> None:
    answer = {"title": "Curies", "summary": "Physicists.", "findings": [], "rating": 11}
    llm, completions = writer([json.dumps(answer)])
    item = ReportInput(**{**ITEM.__dict__, "children": [ChildSummary("Kids", "Child report", 2)]})
    [report] = llm.write([item])
    assert (report.title, report.rating, report.writer, report.usage) == (
        "Curies",
        10.0,
        "openai:m",
        (10, 5),
    )
    call = completions.calls[0]
    assert call["response_format"]["type"] == "json_schema"
    prompt = call["messages"][1]["content"]
    assert prompt.index("Child report") < prompt.index("Marie Curie |")


def test_llm_context_stays_within_the_level_budget() -> None:
    llm, _ = writer([], budget=75)  # the document block's tags take ~12 of them
    many = [EntityFact(f"Entity {i}", "X", "word " * 20, 0.0) for i in range(50)]
    context = llm.context(ReportInput(**{**ITEM.__dict__, "entities": many}))
    assert len(llm._encoding.encode(context)) <= 75 + 10
    assert "Entity 0" in context
    assert "Entity 49" not in context


def test_malformed_llm_output_falls_back_to_extractive() -> None:
    llm, completions = writer(["not json", '{"title": ""}'])
    [report] = llm.write([ITEM])
    assert len(completions.calls) == 2  # retried once, then gave up
    assert report.writer == ExtractiveWriter.name  # so the next recompute asks the LLM again
    assert report.usage == (20, 10)


def test_plan_reuses_reports_by_fingerprint_and_writer() -> None:
    structure = compute_structure(
        planted(3, 8, 0.8, 0.02), None, LeidenConfig(max_sizes=(100,)), 0.3, 1
    )
    prints = structure.levels[0].fingerprints
    plan = plan_reports(
        structure, {prints[0]: "extractive", prints[1]: "openai:m"}, "extractive", 5, 5
    )
    assert plan.levels[0].generate == [1, 2]
    assert plan.reused == 1
    assert all(len(v) <= 5 for v in plan.levels[0].top_nodes.values())
    top = plan.levels[0].top_nodes[1]
    assert (np.diff(structure.pagerank[top]) <= 0).all()  # most important first


def test_members_copy_round_trips_through_the_binary_format() -> None:
    structure = compute_structure(
        planted(3, 8, 0.8, 0.02), None, LeidenConfig(max_sizes=(100,)), 0.3, 40
    )
    row = np.dtype(
        [
            ("n", ">i2"),
            ("l0", ">i4"),
            ("s", ">i8"),
            ("l1", ">i4"),
            ("c", ">i8"),
            ("l2", ">i4"),
            ("e", ">i8"),
        ]
    )
    rows = parse_binary_copy(members_copy(5, structure), row)
    level = structure.levels[0]
    assert (rows["s"] == 5).all()
    assert rows["e"].tolist() == structure.graph.node_ids.tolist()
    assert rows["c"].tolist() == level.ids[level.labels].tolist()


def test_binary_copy_parser_rejects_other_layouts() -> None:
    with pytest.raises(ValueError, match="binary COPY"):
        parse_binary_copy(b"not a copy stream", np.dtype([("n", ">i2")]))
