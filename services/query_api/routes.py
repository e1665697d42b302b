"""HTTP routes: they translate requests into QueryService calls and reads of the published
snapshot; HTTP status codes and problem documents live here and in problems.py only."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from services.core.access import Caller
from services.query_api.auth import ADMIN, INGEST, QUERY, CallerDep
from services.query_api.ingest import DocumentPublisher
from services.query_api.limits import LimitedQuery
from services.query_api.metrics import observe_feedback
from services.query_api.operations import Operations
from services.query_api.problems import Problem
from services.query_api.readiness import Readiness
from services.retrieval.documents import DocumentRead
from services.retrieval.explore import MAX_NODES
from services.retrieval.fact_times import MAX_FACTS
from services.retrieval.filters import Filters, scoped
from services.retrieval.graph_holder import report_of
from services.retrieval.monitoring import FeedbackLedger, parse_query_id
from services.retrieval.plans import Plan, PlanAnswer
from services.retrieval.schemas import (
    MAX_HOPS,
    CommunitiesResponse,
    EntityDetail,
    FactsResponse,
    FeedbackRequest,
    FeedbackResponse,
    IngestAccepted,
    Neighbourhood,
    NoControl,
    NoNul,
    PathsResponse,
    QueryResponse,
    RelationshipDetail,
    error_summary,
)

router = APIRouter()


def get_operations(request: Request) -> Operations:
    """The process's operations (built by create_app)."""
    ops: Operations = request.app.state.operations
    return ops


OpsDep = Annotated[Operations, Depends(get_operations)]


def scoped_caller(
    caller: CallerDep,
    filters: Annotated[
        str | None,
        Query(
            max_length=8000,
            description="Filters as JSON, as POST /v1/query takes them: the graph read sees "
            "only the documents they admit (entities through their mentions in them, "
            "relationships through their evidence).",
        ),
    ] = None,
) -> Caller:
    """The caller, scoped by the request's ``filters`` query parameter."""
    if filters is None:
        return caller
    try:
        parsed = Filters.model_validate_json(filters)
    except ValidationError as exc:
        raise Problem(422, "Invalid filters", error_summary(exc)) from None
    return scoped(caller, parsed)


ScopedCallerDep = Annotated[Caller, Depends(scoped_caller)]


@router.post("/v1/query", response_model=QueryResponse, tags=["query"], dependencies=[QUERY])
async def query(req: LimitedQuery, ops: OpsDep, caller: CallerDep) -> QueryResponse:
    """Answer a question: auto | vector | local | global | path."""
    return await ops.query(req, caller)


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
    ops: OpsDep,
    caller: ScopedCallerDep,
    name: Annotated[
        str, NoNul, Query(min_length=1, max_length=200, description="Name to look up.")
    ],
    limit: Annotated[int, Query(ge=1, le=50)] = 10,
    exact: Annotated[
        bool, Query(description="Only the entities this is the name or an alias of.")
    ] = False,
) -> dict[str, Any]:
    """Entities whose name or alias matches, best first: the name or an alias itself (score
    1), then similar names (trigram similarity) unless ``exact``."""
    return await ops.entities(name, limit, caller, exact=exact)


@router.get(
    "/v1/entities/{entity_id}", response_model=EntityDetail, tags=["graph"], dependencies=[QUERY]
)
async def entity(
    ops: OpsDep,
    caller: ScopedCallerDep,
    entity_id: Annotated[int, Path(ge=1)],
    neighbours: Annotated[int, Query(ge=0, le=200)] = 25,
) -> EntityDetail:
    """One entity with its strongest relationships and their best evidence."""
    return await ops.entity(entity_id, neighbours, caller)


@router.get(
    "/v1/entities/{entity_id}/neighbourhood",
    response_model=Neighbourhood,
    tags=["graph"],
    dependencies=[QUERY],
)
async def entity_neighbourhood(
    ops: OpsDep,
    caller: ScopedCallerDep,
    entity_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
    hops: Annotated[int, Query(ge=1, le=2)] = 1,
    limit: Annotated[int, Query(ge=2, le=MAX_NODES)] = 150,
) -> Neighbourhood:
    """The entity's neighbourhood as the explorer (/explorer) draws it: up to ``limit``
    entities within ``hops``, strongest relationships first, the relationships among them, and
    what the caps cut (``neighbours``, ``notes``)."""
    return await ops.neighbourhood(entity_id, hops, limit, caller)


@router.get("/v1/entities/{entity_id}/mentions", tags=["graph"], dependencies=[QUERY])
async def entity_mentions(
    ops: OpsDep,
    caller: ScopedCallerDep,
    entity_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    """The entity's mentions: the words as said, their sentence and document."""
    return await ops.mentions(entity_id, limit, caller)


@router.get(
    "/v1/relationships/{relationship_id}",
    response_model=RelationshipDetail,
    tags=["graph"],
    dependencies=[QUERY],
)
async def relationship(
    ops: OpsDep,
    caller: ScopedCallerDep,
    relationship_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
) -> RelationshipDetail:
    """One relationship: its ends, type, weight, and its strongest evidence sentences."""
    return await ops.relationship(relationship_id, caller)


@router.get("/v1/paths", response_model=PathsResponse, tags=["graph"], dependencies=[QUERY])
async def paths(
    *,
    ops: OpsDep,
    caller: ScopedCallerDep,
    source: Annotated[str, NoNul, Query(alias="from", min_length=1, max_length=200)],
    target: Annotated[str, NoNul, Query(alias="to", min_length=1, max_length=200)],
    k: Annotated[int, Query(ge=1, le=10)] = 3,
    max_hops: Annotated[int, Query(ge=1, le=MAX_HOPS)] = MAX_HOPS,
) -> PathsResponse:
    """k shortest paths (≤ max_hops) between two entities given by id or name."""
    return await ops.paths(source, target, k, max_hops, caller)


@router.post("/v1/graph/query", response_model=PlanAnswer, tags=["graph"], dependencies=[QUERY])
async def graph_query(plan: Plan, ops: OpsDep, caller: ScopedCallerDep) -> PlanAnswer:
    """Answer a typed graph plan (schemas/graph_plan.v1.json): count, list, group, rank or
    compare entities reached from named or typed ones along relationships, each row with its
    evidence, under the caller's visibility (and ``filters``). A plan that would reach too
    many entities or run too long is refused with 422 and what to narrow."""
    return await ops.graph_query(plan, caller)


@router.get("/v1/facts", response_model=FactsResponse, tags=["graph"], dependencies=[QUERY])
async def facts(
    *,
    ops: OpsDep,
    caller: ScopedCallerDep,
    entity: Annotated[
        str | None,
        NoNul,
        Query(min_length=1, max_length=200, description="An entity by id or name."),
    ] = None,
    rel_type: Annotated[
        str | None,
        NoNul,
        Query(alias="type", min_length=1, max_length=100, description="A relationship type."),
    ] = None,
    at: Annotated[date | None, Query(description="Facts that held on this day.")] = None,
    since: Annotated[
        date | None, Query(alias="from", description="Facts that held on or after this day.")
    ] = None,
    until: Annotated[
        date | None, Query(alias="to", description="Facts that held on or before this day.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_FACTS)] = 50,
) -> FactsResponse:
    """Time-scoped facts (what a sentence states and when it held) of an entity or of the
    graph: those holding on a day (``at``) or meeting days ``[from, to]``, the narrowest
    spans first."""
    return await ops.facts(entity, at, since, until, rel_type, limit, caller)


@router.get(
    "/v1/communities", response_model=CommunitiesResponse, tags=["graph"], dependencies=[QUERY]
)
async def communities(
    ops: OpsDep,
    caller: CallerDep,
    level: Annotated[int | None, Query(ge=0, le=16)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    entity: Annotated[
        int | None, Query(ge=1, le=2**63 - 1, description="Only the communities of this entity.")
    ] = None,
) -> CommunitiesResponse:
    """Communities of the published snapshot (one level, or all; an entity's, with
    ``entity``) the caller may read, best rated first."""
    return await ops.communities(level, limit, caller, entity)


@router.get(
    "/v1/documents/{doc_id:path}",
    response_model=DocumentRead,
    tags=["graph"],
    dependencies=[QUERY],
)
async def get_document(
    ops: OpsDep,
    caller: CallerDep,
    doc_id: Annotated[str, NoControl, Path(min_length=1, max_length=512)],
) -> DocumentRead:
    """A live document the caller can see, with its text as indexed (rebuilt from its stored
    chunks); 404 otherwise, which does not say whether the id exists."""
    return await ops.document(doc_id, caller)


@router.post(
    "/v1/documents",
    status_code=202,
    response_model=IngestAccepted,
    tags=["ingest"],
    dependencies=[INGEST],
)
async def post_documents(
    request: Request,
    ops: OpsDep,
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
    return await ops.ingest(body, caller, content_type=request.headers.get("content-type"))


@router.delete(
    "/v1/documents/{doc_id:path}",
    status_code=202,
    response_model=IngestAccepted,
    tags=["ingest"],
    dependencies=[INGEST],
)
async def delete_document(
    ops: OpsDep,
    caller: CallerDep,
    doc_id: Annotated[str, NoControl, Path(min_length=1, max_length=512)],
) -> IngestAccepted:
    """Publish "this document is gone as of now": it applies over everything published
    before it. A non-admin key may not delete an id stored under another tenant: 404, which
    does not say whether the id exists. An id nobody stored gets a tombstone with the key's
    tenant."""
    return await ops.delete(doc_id, caller)


@router.get("/v1/status", tags=["operations"], dependencies=[ADMIN])
async def status(ops: OpsDep) -> dict[str, Any]:
    """Row counts, the published snapshot, the indexer's progress, lag and stalls, and recent
    activity: throughput, freshness, dead letters by reason, change ratio against the
    threshold, snapshot history, token use; each read replica's replay lag."""
    return await ops.status()


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
    only global mode has nothing to say; /v1/status has the detail and the lag. ``ingest``
    (ok | unavailable, with ``ingest_detail``) says whether the last POST /v1/documents reached
    the broker: while it cannot, ingest answers 503 and queries are still served, so it does
    not change the status code either. ``graph_memory`` is the held graph local mode walks
    (its ``graph_changes`` watermark, size and age; null when this process walks the
    database), read from memory."""
    readiness: Readiness = request.app.state.readiness
    code, body = await readiness.answer()
    publisher: DocumentPublisher = request.app.state.publisher
    held = {"graph_memory": report_of(request.app.state.service.graph)}
    return JSONResponse({**body, **publisher.state, **held}, status_code=code)
