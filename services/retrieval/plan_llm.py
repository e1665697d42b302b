"""Questions to typed graph plans with an LLM (issue 33): the model writes the plan, which is
validated like any other (services/retrieval/plans.py) and executed by this project's
statements; a plan that does not validate, or a model that fails, leaves the question to the
rules (plan_rules.py). The model sees the question, the names the graph knows in it and the
graph's relationship types, never a document; what it writes is data, never query text."""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import ValidationError

from services.core.llm.prompts import neutralise
from services.retrieval.llm import ChatModel, ChatReply
from services.retrieval.plans import Plan, plan_json_schema

PLAN_SYSTEM = (
    "You turn a question about a knowledge graph into a typed graph plan, when the question "
    "asks to count, list, group, rank or compare entities, to follow relationships from named "
    "entities (what is affected if X fails: follow out up to 3 hops), or to exclude what is "
    'related to one (negation). Answer JSON {"plan": PLAN} with PLAN valid under this JSON '
    'Schema, or {"plan": null} when the question asks for something else (a fact stated in a '
    "passage, a summary). Use only the relationship types listed and entity names as the "
    "question says them; entity types are PERSON, ORG, GPE, LOC, NORP, FAC, PRODUCT, EVENT, "
    "WORK_OF_ART, LAW, LANGUAGE.\n\nSchema:\n"
    + json.dumps(plan_json_schema(), separators=(",", ":"))
)
PLAN_TOKENS = 400  # a plan is a few hundred characters of JSON


def plan_prompt(question: str, names: Sequence[str], types: Sequence[str]) -> str:
    """The user message: the graph's relationship types, the names it knows in the question,
    then the question."""
    return (
        f"Relationship types: {', '.join(types) or '(none)'}\n"
        f"Entities named in the question: {', '.join(names) or '(none)'}\n"
        f"Question: {neutralise(question)}"
    )


def llm_plan(
    llm: ChatModel, question: str, names: Sequence[str], types: Sequence[str]
) -> tuple[Plan | None, ChatReply, str]:
    """(plan, reply, why there is none): the model's plan when it validates (blocking)."""
    reply = llm.complete(
        PLAN_SYSTEM, plan_prompt(question, names, types), max_tokens=PLAN_TOKENS, json_mode=True
    )
    try:
        data = json.loads(reply.content)
    except json.JSONDecodeError:
        return None, reply, "the model's answer is not JSON"
    written = data.get("plan") if isinstance(data, dict) else None
    if written is None:
        return None, reply, "the model says the question states no plan"
    try:
        return Plan.model_validate(written), reply, ""
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "plan"
        return None, reply, f"the model's plan is invalid ({where}: {first['msg']})"
