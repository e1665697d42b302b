"""``/v1/review`` (admin scope): the seed's review sample of entity links for a person to
judge, and judged items turned into curations, as `kgstream review sample` and `kgstream review
apply` do (services/maintenance/review.py; docs/curation.md, "Review"). The explorer
(/explorer) shows the sample as pairs to judge. Who made a rule is the API key's id and name."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from services.maintenance.review import apply_verdicts, check_item, sample
from services.query_api.auth import ADMIN, Principal, authenticate
from services.query_api.curation_routes import who
from services.query_api.problems import Problem

router = APIRouter(tags=["curation"], dependencies=[ADMIN])
MAX_ITEMS = 500  # items one sample draws, or one request judges


class Verdicts(BaseModel):
    """Judged review items: each as the sample gave it, with ``label``: same, different or
    unsure."""

    items: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_ITEMS)
    dry_run: bool = Field(default=False, description="Say what it would make; make nothing.")


@router.get("/v1/review/sample")
async def review_sample(
    request: Request,
    principal: Annotated[Principal, Depends(authenticate)],
    n: Annotated[int, Query(ge=1, le=MAX_ITEMS, description="Items to draw in all.")] = 20,
    merged_share: Annotated[float, Query(ge=0.0, le=1.0)] = 0.5,
    seed: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
) -> dict[str, Any]:
    """Merges and pairs kept apart, each side with the sentences that mention it, for a
    person to judge (add ``label`` to each, then ``POST /v1/review/verdicts``). The sample
    quotes documents of every tenant and ACL, so it needs an admin key even where keys are
    not required (403 for the anonymous caller)."""
    if not principal.caller.admin:
        raise Problem(
            403,
            "Forbidden",
            "the review sample quotes every document: it needs an admin key "
            "(kgstream keys create --scopes admin)",
        )
    merges = round(n * merged_share)
    budget_ms = max(1, int(request.app.state.settings.query_timeout_s * 1000))
    try:
        async with request.app.state.service.engine.connect() as conn, conn.begin():
            await conn.execute(text(f"SET LOCAL statement_timeout = {budget_ms}"))
            items = await sample(conn, candidates=n - merges, merges=merges, seed=seed)
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != "57014":  # statement_timeout
            raise
        raise Problem(
            422,
            "Sample too slow to draw",
            "drawing pairs kept apart compares every pair of entities, which takes longer than "
            "KGSTREAM_QUERY_TIMEOUT_S on a graph this large (docs/curation.md, Review); draw "
            "merges only: merged_share=1",
        ) from None
    for i, item in enumerate(items):
        item["id"] = f"review-{i:04d}"
    return {"items": items}


@router.post("/v1/review/verdicts")
async def review_verdicts(
    body: Verdicts,
    request: Request,
    principal: Annotated[Principal, Depends(authenticate)],
) -> dict[str, Any]:
    """Judged items turned into curations, as `kgstream review apply` does: a pair judged the
    same that the graph keeps apart becomes a merge, one judged different that it merged a
    split, one judged different and kept apart a block; with the linking figures they
    measure. 422 names the first item that is not a judged review item."""
    for number, item in enumerate(body.items, start=1):
        try:
            check_item(item)
        except ValueError as exc:
            raise Problem(422, "Unprocessable Content", f"items[{number - 1}]: {exc}") from None
    judged = list(enumerate(body.items, start=1))
    engine = request.app.state.service.engine
    return await apply_verdicts(
        engine, judged, by=who(principal), source="explorer", dry_run=body.dry_run
    )
