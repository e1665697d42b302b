"""HTTP routes: they translate requests into QueryService calls and reads of the published
snapshot; HTTP status codes and problem documents live here and in problems.py only."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Request
from fastapi.responses import JSONResponse
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.status import database_status
from services.query_api.auth import ADMIN, INGEST, QUERY, CallerDep
from services.query_api.entities import entity_detail, search_entities
from services.query_api.global_mode import list_communities
from services.query_api.ingest import (
    NOT_HELD,
    DocumentPublisher,
    bind_tenant,
    delete_event,
    stored_documents,
    tenant_bound,
    validate_batch,
    writable_by,
)
from services.query_api.limits import LimitedQuery
from services.query_api.metrics import observe_failed_query, observe_feedback, observe_query
from services.query_api.monitoring import FeedbackLedger, parse_query_id
from services.query_api.paths import find_routes
from services.query_api.problems import Problem
from services.query_api.readiness import Readiness
from services.query_api.schemas import (
    MAX_HOPS,
    CommunitiesResponse,
    EntityDetail,
    EntitySummary,
    FeedbackRequest,
    FeedbackResponse,
    IngestAccepted,
    NoControl,
    NoNul,
    PathsResponse,
    QueryResponse,
)
from services.query_api.service import QueryService

router = APIRouter()


def get_service(request: Request) -> QueryService:
    """The process's QueryService (built by create_app)."""
    service: QueryService = request.app.state.service
    return service


def get_publisher(request: Request) -> DocumentPublisher:
    """The process's document publisher (built by create_app)."""
    publisher: DocumentPublisher = request.app.state.publisher
    return publisher


ServiceDep = Annotated[QueryService, Depends(get_service)]
PublisherDep = Annotated[DocumentPublisher, Depends(get_publisher)]


@router.post("/v1/query", response_model=QueryResponse, tags=["query"], dependencies=[QUERY])
async def query(req: LimitedQuery, svc: ServiceDep, caller: CallerDep) -> QueryResponse:
    """Answer a question: auto | vector | local | global | path."""
    try:
        resp = await svc.query(req, caller)
    except Problem as exc:
        observe_failed_query(req.mode, exc.status)
        raise
    except Exception:
        observe_failed_query(req.mode, 500)
        raise
    observe_query(resp)
    return resp


@router.post("/v1/feedback", response_model=FeedbackResponse, tags=["query"], dependencies=[QUERY])
async def feedback(body: FeedbackRequest, request: Request) -> FeedbackResponse:
    """Whether an answer was useful, counted by its A/B arm and mode used
    (kgstream_query_feedback_total); a second verdict on the same answer is not counted."""
    try:
        arm, mode = parse_query_id(body.query_id)
    except ValueError as exc:
        raise Problem(422, "Invalid query id", str(exc)) from None
    ledger: FeedbackLedger = request.app.state.feedback
    counted = ledger.first(body.query_id)
    if counted:
        observe_feedback(arm, mode, body.useful)
    return FeedbackResponse(counted=counted, arm=arm, mode=mode)


@router.get("/v1/entities", tags=["graph"], dependencies=[QUERY])
async def entities(
    svc: ServiceDep,
    caller: CallerDep,
    name: Annotated[
        str, NoNul, Query(min_length=1, max_length=200, description="Name to look up.")
    ],
    limit: Annotated[int, Query(ge=1, le=50)] = 10,
) -> dict[str, Any]:
    """Entities whose name or alias matches, best first."""
    async with svc.read_as(caller) as (conn, snapshot_id, reader):
        found = await search_entities(conn, name, limit, caller=reader)
    return {"snapshot_id": snapshot_id, "entities": [e.model_dump() for e in found]}


@router.get(
    "/v1/entities/{entity_id}", response_model=EntityDetail, tags=["graph"], dependencies=[QUERY]
)
async def entity(
    svc: ServiceDep,
    caller: CallerDep,
    entity_id: Annotated[int, Path(ge=1)],
    neighbours: Annotated[int, Query(ge=0, le=200)] = 25,
) -> EntityDetail:
    """One entity with its strongest relationships and their best evidence."""
    async with svc.read_as(caller) as (conn, _, reader):
        found = await entity_detail(conn, entity_id, neighbours, caller=reader)
    if found is None:
        raise Problem(404, "Entity not found", f"no entity has id {entity_id}")
    return found


@router.get("/v1/paths", response_model=PathsResponse, tags=["graph"], dependencies=[QUERY])
async def paths(
    *,
    svc: ServiceDep,
    caller: CallerDep,
    source: Annotated[str, NoNul, Query(alias="from", min_length=1, max_length=200)],
    target: Annotated[str, NoNul, Query(alias="to", min_length=1, max_length=200)],
    k: Annotated[int, Query(ge=1, le=10)] = 3,
    max_hops: Annotated[int, Query(ge=1, le=MAX_HOPS)] = MAX_HOPS,
) -> PathsResponse:
    """k shortest paths (≤ max_hops) between two entities given by id or name."""
    async with svc.read_as(caller) as (conn, snapshot_id, reader):
        ends = [
            await _resolve(conn, source, "from", reader),
            await _resolve(conn, target, "to", reader),
        ]
        routes, _ = await find_routes(conn, ends[0].id, ends[1].id, k, max_hops, caller=reader)
    return PathsResponse(source=ends[0], target=ends[1], snapshot_id=snapshot_id, paths=routes)


async def _resolve(conn: AsyncConnection, ref: str, param: str, caller: Caller) -> EntitySummary:
    if ref.isdigit():
        found = await entity_detail(conn, int(ref), 0, caller=caller)
        if found is not None:
            return EntitySummary(**found.model_dump(include=set(EntitySummary.model_fields)))
    matches = await search_entities(conn, ref, 1, caller=caller)
    if not matches:
        raise Problem(404, "Entity not found", f"{param}={ref!r} matches no entity")
    return matches[0]


@router.get(
    "/v1/communities", response_model=CommunitiesResponse, tags=["graph"], dependencies=[QUERY]
)
async def communities(
    svc: ServiceDep,
    caller: CallerDep,
    level: Annotated[int | None, Query(ge=0, le=16)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> CommunitiesResponse:
    """Communities of the published snapshot (one level, or all) the caller may read, best
    rated first."""
    async with svc.read_as(caller) as (conn, snapshot_id, reader):
        found = []
        if snapshot_id is not None:
            found = await list_communities(
                conn, snapshot_id, level, limit, caller=reader, erasures=svc.withheld
            )
    return CommunitiesResponse(snapshot_id=snapshot_id, level=level, communities=found)


@router.post(
    "/v1/documents",
    status_code=202,
    response_model=IngestAccepted,
    tags=["ingest"],
    dependencies=[INGEST],
)
async def post_documents(
    request: Request,
    publisher: PublisherDep,
    svc: ServiceDep,
    caller: CallerDep,
    body: Annotated[
        Any,
        Body(
            description="One document event v1, or a list of them (application/json); one "
            "CloudEvent 1.0 (application/cloudevents+json) or a list of them "
            "(application/cloudevents-batch+json)."
        ),
    ],
) -> IngestAccepted:
    """Validate document events and publish them to the documents topic (all or none). A
    non-admin key writes only into its own tenant: events without a tenant get the key's.
    CloudEvents (structured or batch mode) are converted to document events first and
    published in that form (docs/ingest.md, "CloudEvents")."""
    settings = request.app.state.settings
    events, problems = validate_batch(
        body,
        settings.max_document_bytes,
        settings.ingest_max_events,
        content_type=request.headers.get("content-type"),
        types=settings.cloudevent_types,
    )
    if problems:
        detail = f"{len(problems)} invalid event(s); nothing was published"
        raise Problem(422, "Invalid document events", detail, errors=problems)
    if tenant_bound(caller):
        async with svc.engine.connect() as conn:
            rows = await stored_documents(conn, [str(e["doc_id"]) for e in events])
        problems = bind_tenant(events, caller.tenant, rows)
        if problems:
            detail = f"{len(problems)} event(s) outside this key's tenant; nothing was published"
            raise Problem(403, "Forbidden", detail, errors=problems)
    await asyncio.to_thread(publisher.send, events)
    ids = [str(e["event_id"]) for e in events]
    return IngestAccepted(accepted=len(ids), event_ids=ids, topic=publisher.topic)


@router.delete(
    "/v1/documents/{doc_id:path}",
    status_code=202,
    response_model=IngestAccepted,
    tags=["ingest"],
    dependencies=[INGEST],
)
async def delete_document(
    request: Request,
    publisher: PublisherDep,
    svc: ServiceDep,
    caller: CallerDep,
    doc_id: Annotated[str, NoControl, Path(min_length=1, max_length=512)],
) -> IngestAccepted:
    """Publish "this document is gone as of now" (``delete_event``): it applies over
    everything published before it. A non-admin key may not delete an id stored under another
    tenant (``writable_by``): 404, which does not say whether the id exists. An id nobody
    stored gets a tombstone with the key's tenant."""
    async with svc.engine.connect() as conn:
        stored = (await stored_documents(conn, [doc_id])).get(doc_id)
    bound = tenant_bound(caller)
    if bound and not writable_by(stored, caller.tenant):
        raise Problem(404, "Document not found", NOT_HELD)
    event = delete_event(
        doc_id,
        stored=stored,
        tenant=caller.tenant if bound else None,
        max_skew_s=request.app.state.settings.max_clock_skew_s,
    )
    await asyncio.to_thread(publisher.send, [event])
    return IngestAccepted(accepted=1, event_ids=[event["event_id"]], topic=publisher.topic)


@router.get("/v1/status", tags=["operations"], dependencies=[ADMIN])
async def status(request: Request, svc: ServiceDep) -> dict[str, Any]:
    """Row counts, the published snapshot, the indexer's progress, lag and stalls, and recent
    activity: throughput, freshness, dead letters by reason, change ratio against the
    threshold, snapshot history, token use; each read replica's replay lag."""
    settings = request.app.state.settings
    doc = await database_status(
        svc.engine,
        bootstrap=get_publisher(request).bootstrap,
        stall_after_s=settings.indexer_stall_after_s,
        recompute_threshold=settings.recompute_threshold,
        freshness_window_s=settings.status_freshness_window_s,
    )
    doc["replicas"] = svc.reads.report() if svc.reads is not None else []  # their last check
    return doc


@router.get("/healthz", tags=["operations"])
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz", tags=["operations"])
async def readyz(request: Request) -> JSONResponse:
    """200 when the database answers within the readiness budget on the probe's own connection
    (queries can be served), else 503 naming what did not answer. The indexer's state and the
    published snapshot ride along (``indexer``: ok | stalled | unknown, by the stall rule of
    `kgstream status`; ``snapshot``: its id, or null before the first) without changing the
    status code: a stalled indexer leaves answers stale, not impossible, and without a snapshot
    only global mode has nothing to say; /v1/status has the detail and the lag."""
    readiness: Readiness = request.app.state.readiness
    code, body = await readiness.answer()
    return JSONResponse(body, status_code=code)
