"""The parts of plan execution (services/retrieval/plan_exec.py) that need no database: group
keys, and the time budget a plan gets from the settings."""

from __future__ import annotations

from services.core.settings import Settings
from services.retrieval.plan_exec import _group_keys
from services.retrieval.service import plan_budget_s
from services.retrieval.visibility import EntityFacts


def facts(name: str) -> EntityFacts:
    return EntityFacts(name, "ORG", 1, "", [])


def test_two_entities_of_one_name_are_two_groups() -> None:
    keys = _group_keys({1, 2, 3}, {1: facts("Acme"), 2: facts("Acme"), 3: facts("Brill")})
    assert keys == {1: "Acme (#1)", 2: "Acme (#2)", 3: "Brill"}


def test_the_plan_budget_is_capped_by_the_statement_timeout() -> None:
    assert plan_budget_s(Settings(query_plan_timeout_s=5, db_statement_timeout_s=60)) == 5
    assert plan_budget_s(Settings(query_plan_timeout_s=5, db_statement_timeout_s=2)) == 2
    assert plan_budget_s(Settings(query_plan_timeout_s=5, db_statement_timeout_s=0)) == 5
