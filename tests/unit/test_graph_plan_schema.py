"""The graph plan's JSON Schema (schemas/graph_plan.v1.json) is the models' own
(services/retrieval/plans.py): the file equals what the models generate, and what the schema
refuses the models refuse too (the models also check what a schema cannot state: a start with
something in it, the depths' sum, compare's two names, group_by "related" with its step)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from services.retrieval.plans import MAX_DEPTH, Plan, plan_json_schema

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "graph_plan.v1.json"

GOOD: list[dict[str, Any]] = [
    {"start": {"names": ["APAC"]}, "result": {"op": "count"}},
    {
        "schema_version": 1,
        "start": {"names": ["APAC"]},
        "follow": [{"relationships": ["LOCATED_IN"], "direction": "in"}],
        "where": {"types": ["ORG"]},
        "exclude": {"names": ["Acme"], "relationships": ["SUPPLIES"], "direction": "out"},
        "result": {"op": "list", "limit": 10, "offset": 20},
    },
    {"start": {"types": ["ORG"]}, "result": {"op": "rank", "rank_by": "mentions"}},
    {"start": {"names": ["A", "B"]}, "result": {"op": "compare"}},
    {
        "start": {"types": ["ORG"]},
        "result": {"op": "group", "group_by": "related", "related": {"relationships": ["IN"]}},
    },
]
# refused by the schema itself (and so by the models)
BAD_SHAPE: list[dict[str, Any]] = [
    {"start": {"names": ["A"]}, "result": {"op": "delete"}},
    {"start": {"names": [""]}, "result": {"op": "count"}},
    {"start": {"types": ["ORG OR 1=1"]}, "result": {"op": "count"}},
    {"start": {"names": ["A"]}, "follow": [{"depth": MAX_DEPTH + 1}], "result": {"op": "count"}},
    {"start": {"names": ["A"]}, "result": {"op": "list", "limit": 100_000}},
    {"start": {"names": ["A"]}, "result": {"op": "count"}, "cypher": "MATCH (n) RETURN n"},
    {"schema_version": 2, "start": {"names": ["A"]}, "result": {"op": "count"}},
]
# shapes the schema admits and the models refuse
BAD_RULE: list[dict[str, Any]] = [
    {"start": {}, "result": {"op": "count"}},
    {"start": {"names": ["A"]}, "follow": [{"depth": 2}, {"depth": 2}], "result": {"op": "count"}},
    {"start": {"names": ["A"]}, "result": {"op": "compare"}},
    {"start": {"names": ["A"]}, "result": {"op": "group", "group_by": "related"}},
]


def test_the_file_is_the_models_schema() -> None:
    assert json.loads(SCHEMA.read_text(encoding="utf-8")) == plan_json_schema(), (
        "regenerate: python -c 'import json; from services.retrieval.plans import "
        "plan_json_schema as s; print(json.dumps(s(), indent=2, ensure_ascii=False))' "
        "> schemas/graph_plan.v1.json"
    )


@pytest.mark.parametrize("plan", GOOD)
def test_good_plans_pass_both(plan: dict[str, Any]) -> None:
    jsonschema.validate(plan, plan_json_schema())
    Plan.model_validate(plan)


@pytest.mark.parametrize("plan", BAD_SHAPE)
def test_bad_shapes_fail_both(plan: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(plan, plan_json_schema())
    with pytest.raises(ValidationError):
        Plan.model_validate(plan)


@pytest.mark.parametrize("plan", BAD_RULE)
def test_rules_beyond_the_schema_fail_the_models(plan: dict[str, Any]) -> None:
    jsonschema.validate(plan, plan_json_schema())
    with pytest.raises(ValidationError):
        Plan.model_validate(plan)
