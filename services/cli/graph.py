"""`kgstream graph`: a typed graph plan (schemas/graph_plan.v1.json) through the query API when
one answers on api_host:api_port, else straight from the database as the operator; the JSON is
the API's PlanAnswer either way."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from services.cli.query import api_headers, api_ready, api_url, refusal
from services.core.access import Caller
from services.core.db.engine import check_schema
from services.core.infra.manager import resolve_endpoints
from services.core.settings import Settings
from services.retrieval.compose import build_service
from services.retrieval.plan_exec import execute
from services.retrieval.plans import Plan, PlanAnswer
from services.retrieval.service import plan_budget_s


def read_plan(given: str) -> Plan:
    """The plan from JSON text, or from a file named ``@PATH``; ValueError (with pydantic's
    field errors) when it is not a valid plan."""
    raw = Path(given[1:]).read_text(encoding="utf-8") if given.startswith("@") else given
    return Plan.model_validate_json(raw)


def plan_via_api(settings: Settings, plan: Plan) -> PlanAnswer:
    """POST /v1/graph/query, with the configured API key."""
    resp = httpx.post(
        f"{api_url(settings)}/v1/graph/query",
        json=plan.model_dump(mode="json", exclude_defaults=True),
        headers=api_headers(settings),
        timeout=settings.query_timeout_s + 5,
    )
    if resp.status_code != 200:
        raise refusal(resp)
    return PlanAnswer.model_validate(resp.json())


def plan_direct(settings: Settings, plan: Plan) -> PlanAnswer:
    """The plan on the database, in-process, as the operator."""
    service = build_service(settings, resolve_endpoints(settings).database_url)

    async def go() -> PlanAnswer:
        try:
            await check_schema(service.engine, settings.embedding_dim)
            async with service.read_as(Caller.operator()) as (conn, snapshot_id, caller):
                return await execute(
                    conn,
                    plan,
                    caller,
                    snapshot_id=snapshot_id,
                    budget_s=plan_budget_s(settings),
                )
        finally:
            await service.engine.dispose()

    return asyncio.run(go())


def run_plan(settings: Settings, plan: Plan) -> PlanAnswer:
    """The plan's answer, through the API when it runs."""
    if api_ready(settings):
        return plan_via_api(settings, plan)
    return plan_direct(settings, plan)


def describe(answer: PlanAnswer) -> list[str]:
    """The answer as lines for a terminal."""
    op = answer.plan.result.op
    started = ", ".join(f"{r.name} ({r.type})" for r in answer.started_from) or "nothing"
    lines = [f"[graph {op}] from {started}: {answer.count} entities"]
    for row in answer.rows:
        value = "" if row.value is None else f" = {row.value:g}"
        lines.append(f"  {row.name} ({row.type}, {row.hops} hops){value}")
        lines += [
            f"    {e.relationship or 'named'}: {e.sentence} [{e.doc_id}]" for e in row.evidence
        ]
    for group in answer.groups:
        lines.append(f"  {group.key}: {group.count} ({', '.join(group.members)})")
    if answer.comparison is not None:
        c = answer.comparison
        lines.append(
            f"  {c.a.entity.name} ({c.a.entity.type}) vs {c.b.entity.name} ({c.b.entity.type})"
        )
        lines += [f"    both: {x}" for x in c.shared]
        lines += [f"    only {c.a.entity.name}: {x}" for x in c.only_a]
        lines += [f"    only {c.b.entity.name}: {x}" for x in c.only_b]
    lines += [f"  note: {n}" for n in answer.notes]
    return lines


def plan_json(answer: PlanAnswer) -> str:
    """The answer as the API's JSON."""
    return json.dumps(answer.model_dump(mode="json"), indent=2, ensure_ascii=False)
