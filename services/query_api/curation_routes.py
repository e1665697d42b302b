"""``/v1/curations`` (admin scope): people's corrections to entity resolution, the same rules
`kgstream curate` makes (services/core/curations.py; docs/curation.md, "Curations"). Who made a
rule is the API key's id and name; the indexer applies it to the stored documents within
``KGSTREAM_CURATION_APPLY_INTERVAL_S``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse

from services.core.curations import Curation, CurationError, create, get, list_all, undo
from services.query_api.auth import ADMIN, Principal, authenticate
from services.query_api.problems import Problem
from services.retrieval.schemas import CurationOut, CurationRequest, CurationsResponse, UndoRequest

router = APIRouter(tags=["curation"], dependencies=[ADMIN])
_STATUS = {"invalid": 422, "not_found": 404, "conflict": 409}
_TITLE = {"invalid": "Unprocessable Content", "not_found": "Not Found", "conflict": "Conflict"}
CurationId = Annotated[int, Path(ge=1, le=2**63 - 1, description="From `GET /v1/curations`.")]


def who(principal: Principal) -> str:
    key = principal.key
    return "anonymous" if key is None else f"key:{key.id} ({key.name})"


def _problem(exc: CurationError) -> Problem:
    return Problem(_STATUS[exc.code], _TITLE[exc.code], exc.detail)


def _out(curation: Curation) -> dict[str, Any]:
    return CurationOut.model_validate(curation.as_json()).model_dump(mode="json")


@router.get("/v1/curations", response_model=CurationsResponse)
async def list_curations(request: Request) -> CurationsResponse:
    """Every curation, oldest first, undone ones too (the audit trail): who made it, when, why,
    and its status (``pending`` until the indexer has resolved the documents it touches
    again)."""
    found = await list_all(request.app.state.service.engine)
    return CurationsResponse(curations=[CurationOut.model_validate(c.as_json()) for c in found])


@router.post(
    "/v1/curations",
    response_model=CurationOut,
    status_code=201,
    responses={200: {"model": CurationOut, "description": "The same rule is in force already."}},
)
async def make_curation(
    body: CurationRequest,
    request: Request,
    principal: Annotated[Principal, Depends(authenticate)],
) -> JSONResponse:
    """Make a rule that entity resolution applies at every later ingest: ``merge`` (``other``
    resolves to ``name``), ``alias`` (the same for a name not seen yet), ``block`` (never one
    entity), ``split`` (take ``other`` out of ``name``, where it was merged), ``rename``
    (``other`` is the new name). 201 with the rule (``pending``); 200 with the rule in force when
    one says the same already; 404 when a name it needs names no entity; 409 when a rule in
    force contradicts it."""
    try:
        made, new = await create(
            request.app.state.service.engine,
            body.kind,
            body.name,
            body.other,
            reason=body.reason,
            by=who(principal),
        )
    except CurationError as exc:
        raise _problem(exc) from None
    return JSONResponse(_out(made), status_code=201 if new else 200)


@router.get("/v1/curations/{curation_id}", response_model=CurationOut)
async def get_curation(curation_id: CurationId, request: Request) -> CurationOut:
    """One curation (404 when there is none of that id)."""
    try:
        found = await get(request.app.state.service.engine, curation_id)
    except CurationError as exc:
        raise _problem(exc) from None
    return CurationOut.model_validate(found.as_json())


@router.post("/v1/curations/{curation_id}/undo", response_model=CurationOut)
async def undo_curation(
    curation_id: CurationId,
    body: UndoRequest,
    request: Request,
    principal: Annotated[Principal, Depends(authenticate)],
) -> CurationOut:
    """Take a rule out of force (``undoing`` until the indexer has resolved its documents
    again, then ``undone``). Undoing an undone rule changes nothing and returns it."""
    try:
        done, _ = await undo(
            request.app.state.service.engine, curation_id, reason=body.reason, by=who(principal)
        )
    except CurationError as exc:
        raise _problem(exc) from None
    return CurationOut.model_validate(done.as_json())
