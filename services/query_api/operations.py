"""What the query process can do for a caller, once: query, look up entities, paths and
communities, read a document, publish document events, report status. The HTTP routes
(routes.py) and the MCP tools (mcp_server.py) are two translations of these calls; the checks
that decide who may do what (tenant binding, visibility, bounds) live here or below, never in
a translation, so both answer every caller alike. Failures are the engine's refusals
(services/retrieval/errors.py) or, for what only this edge decides (a key's tenant),
``Problem``s; problems.py gives each its HTTP status and title, which each translation renders
its own way."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import date
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from services.core import accepted_events
from services.core.access import Caller
from services.core.settings import Settings
from services.core.status import database_status
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
from services.query_api.limits import within_limits
from services.query_api.metrics import OUTBOX_FAILURES, observe_failed_query, observe_query
from services.query_api.problems import Problem, as_problem
from services.retrieval.documents import DocumentRead, read_document
from services.retrieval.entities import entity_detail, search_entities
from services.retrieval.errors import Invalid, NotFound
from services.retrieval.explore import entity_mentions, neighbourhood, relationship_detail
from services.retrieval.fact_times import Window, read_facts
from services.retrieval.global_mode import list_communities
from services.retrieval.graph_holder import report_of
from services.retrieval.paths import find_routes
from services.retrieval.plans import Plan, PlanAnswer
from services.retrieval.schemas import (
    MAX_HOPS,
    CommunitiesResponse,
    EntityDetail,
    EntitySummary,
    FactsResponse,
    IngestAccepted,
    Neighbourhood,
    PathsResponse,
    QueryRequest,
    QueryResponse,
    RelationshipDetail,
)
from services.retrieval.service import QueryService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Operations:
    """The process's query service, document publisher and settings, and what they do."""

    service: QueryService
    publisher: DocumentPublisher
    settings: Settings

    async def query(
        self, req: QueryRequest, caller: Caller, *, answer: bool = True
    ) -> QueryResponse:
        """Retrieve (and, with ``answer``, answer) from what the caller can see; counted in
        the query metrics (by mode and A/B arm) whichever way it came."""
        try:
            resp = await self.service.query(
                within_limits(req, self.settings), caller, answer=answer
            )
        except Exception as exc:
            found = as_problem(exc)
            observe_failed_query(req.mode, 500 if found is None else found.status)
            raise
        observe_query(resp)
        return resp

    async def entities(
        self, name: str, limit: int, caller: Caller, *, exact: bool = False
    ) -> dict[str, Any]:
        """Entities whose name or alias matches ``name``, best first (``exact``: the name or
        an alias itself only)."""
        async with self.service.read_as(caller) as (conn, snapshot_id, reader):
            found = await search_entities(conn, name, limit, caller=reader, exact=exact)
        return {"snapshot_id": snapshot_id, "entities": [e.model_dump() for e in found]}

    async def entity(self, entity_id: int, neighbours: int, caller: Caller) -> EntityDetail:
        """One entity with its strongest relationships; 404 when the caller cannot see it."""
        async with self.service.read_as(caller) as (conn, _, reader):
            found = await entity_detail(conn, entity_id, neighbours, caller=reader)
        if found is None:
            raise NotFound("Entity not found", f"no entity has id {entity_id}")
        return found

    async def entity_by_ref(self, ref: str, neighbours: int, caller: Caller) -> EntityDetail:
        """``entity`` for an id, or for the best match of a name."""
        async with self.service.read_as(caller) as (conn, _, reader):
            summary = await _resolve(conn, ref, "entity", reader)
            found = await entity_detail(conn, summary.id, neighbours, caller=reader)
        if found is None:  # gone between the two reads
            raise NotFound("Entity not found", f"entity={ref!r} matches no entity")
        return found

    async def neighbourhood(
        self, entity_id: int, hops: int, limit: int, caller: Caller
    ) -> Neighbourhood:
        """The entity's neighbourhood as the explorer draws it; 404 when the caller cannot see
        the entity."""
        async with self.service.read_as(caller) as (conn, snapshot_id, reader):
            found = await neighbourhood(conn, entity_id, hops, limit, caller=reader)
        if found is None:
            raise NotFound("Entity not found", f"no entity has id {entity_id}")
        return found.model_copy(update={"snapshot_id": snapshot_id})

    async def relationship(self, relationship_id: int, caller: Caller) -> RelationshipDetail:
        """One relationship with its evidence; 404 when the caller cannot see it."""
        async with self.service.read_as(caller) as (conn, _, reader):
            found = await relationship_detail(conn, relationship_id, caller=reader)
        if found is None:
            raise NotFound("Relationship not found", f"no relationship has id {relationship_id}")
        return found

    async def mentions(self, entity_id: int, limit: int, caller: Caller) -> dict[str, Any]:
        """The entity's mentions the caller can see, with their sentences and documents."""
        async with self.service.read_as(caller) as (conn, snapshot_id, reader):
            found = await entity_mentions(conn, entity_id, limit, caller=reader)
        return {"snapshot_id": snapshot_id, "mentions": [m.model_dump() for m in found]}

    async def paths(
        self, source: str, target: str, k: int, max_hops: int, caller: Caller
    ) -> PathsResponse:
        """k shortest paths (≤ max_hops) between two entities given by id or name."""
        if not 1 <= k <= 10 or not 1 <= max_hops <= MAX_HOPS:
            detail = f"k must be 1-10 and max_hops 1-{MAX_HOPS} (got k={k}, max_hops={max_hops})"
            raise Invalid("Invalid request", detail)
        async with self.service.read_as(caller) as (conn, snapshot_id, reader):
            ends = [
                await _resolve(conn, source, "from", reader),
                await _resolve(conn, target, "to", reader),
            ]
            routes, _ = await find_routes(conn, ends[0].id, ends[1].id, k, max_hops, caller=reader)
        return PathsResponse(source=ends[0], target=ends[1], snapshot_id=snapshot_id, paths=routes)

    async def graph_query(self, plan: Plan, caller: Caller) -> PlanAnswer:
        """A typed graph plan's answer from what the caller can see (plan_exec.py), within
        ``plan_budget_s``."""
        return await self.service.plan_answer(plan, caller)

    async def facts(  # noqa: PLR0917 - the route's parameters, as it takes them
        self,
        entity: str | None,
        at: date | None,
        since: date | None,
        until: date | None,
        rel_type: str | None,
        limit: int,
        caller: Caller,
    ) -> FactsResponse:
        """Time-scoped facts of an entity (by id or name) or of the whole graph: those that
        held on a day (``at``) or met days [since, until]."""
        try:
            window = Window(at=at, lo=since, hi=until)
        except ValueError as exc:
            raise Invalid("Invalid request", str(exc)) from None
        if entity is None and window.open:
            raise Invalid("Invalid request", "name an entity, a day (at) or days (from, to)")
        async with self.service.read_as(caller) as (conn, _, reader):
            found = None if entity is None else await _resolve(conn, entity, "entity", reader)
            facts = await read_facts(
                conn,
                reader,
                entity_id=None if found is None else found.id,
                window=window,
                rel_type=rel_type,
                limit=limit,
            )
        return FactsResponse(entity=found, facts=facts)

    async def communities(
        self, level: int | None, limit: int, caller: Caller, entity: int | None = None
    ) -> CommunitiesResponse:
        """Communities of the published snapshot the caller may read (those ``entity`` is a
        member of, when given), best rated first."""
        async with self.service.read_as(caller) as (conn, snapshot_id, reader):
            found = []
            if snapshot_id is not None:
                found = await list_communities(
                    conn,
                    snapshot_id,
                    level,
                    limit,
                    caller=reader,
                    erasures=self.service.withheld,
                    entity=entity,
                )
        return CommunitiesResponse(snapshot_id=snapshot_id, level=level, communities=found)

    async def document(self, doc_id: str, caller: Caller) -> DocumentRead:
        """A live document the caller can see, its text rebuilt from its stored chunks; 404
        otherwise (which does not say whether the id exists)."""
        async with self.service.read_as(caller) as (conn, _, reader):
            found = await read_document(conn, doc_id, reader)
        if found is None:
            raise NotFound("Document not found", "no live document with this id is visible")
        return found

    async def ingest(
        self, body: Any, caller: Caller, *, content_type: str | None = None
    ) -> IngestAccepted:
        """Validate document events and publish them to the documents topic (all or none). A
        non-admin key writes only into its own tenant: events without a tenant get the key's.
        ``content_type``: CloudEvents (structured, batch) are converted to document events
        first (services/core/cloudevents.py); anything else is the native contract."""
        events, problems = validate_batch(
            body,
            self.settings.max_document_bytes,
            self.settings.ingest_max_events,
            content_type=content_type,
            types=self.settings.cloudevent_types,
        )
        if problems:
            detail = f"{len(problems)} invalid event(s); nothing was published"
            raise Invalid("Invalid document events", detail, problems)
        if tenant_bound(caller):
            async with self.service.engine.connect() as conn:
                rows = await stored_documents(conn, [str(e["doc_id"]) for e in events])
            problems = bind_tenant(events, caller.tenant, rows)
            if problems:
                detail = (
                    f"{len(problems)} event(s) outside this key's tenant; nothing was published"
                )
                raise Problem(403, "Forbidden", detail, errors=problems)
        return await self._publish(events)

    async def delete(self, doc_id: str, caller: Caller) -> IngestAccepted:
        """Publish "this document is gone as of now" (``delete_event``). A non-admin key may
        not delete an id stored under another tenant: 404, which does not say whether the id
        exists. An id nobody stored gets a tombstone with the key's tenant."""
        async with self.service.engine.connect() as conn:
            stored = (await stored_documents(conn, [doc_id])).get(doc_id)
        bound = tenant_bound(caller)
        if bound and not writable_by(stored, caller.tenant):
            raise NotFound("Document not found", NOT_HELD)
        event = delete_event(
            doc_id,
            stored=stored,
            tenant=caller.tenant if bound else None,
            max_skew_s=self.settings.max_clock_skew_s,
        )
        return await self._publish([event])

    async def status(self) -> dict[str, Any]:
        """The operator's status document (``kgstream status``), the replicas' last check and
        the held graph (null when this process walks the database)."""
        settings = self.settings
        doc = await database_status(
            self.service.engine,
            bootstrap=self.publisher.bootstrap,
            stall_after_s=settings.indexer_stall_after_s,
            recompute_threshold=settings.recompute_threshold,
            freshness_window_s=settings.status_freshness_window_s,
        )
        reads = self.service.reads
        doc["replicas"] = reads.report() if reads is not None else []
        doc["graph_memory"] = report_of(self.service.graph)
        return doc

    async def _publish(self, events: list[dict[str, Any]]) -> IngestAccepted:
        await asyncio.to_thread(self.publisher.send, events)
        try:  # kept until the indexer has them (services/core/accepted_events.py)
            async with self.service.engine.begin() as conn:
                await accepted_events.keep(conn, events)
        except Exception as exc:  # noqa: BLE001 - the broker has them: still accepted
            OUTBOX_FAILURES.inc()
            log.warning("accepted events not kept for a broker loss: %s: %s",
                        type(exc).__name__, exc)  # fmt: skip
        ids = [str(e["event_id"]) for e in events]
        return IngestAccepted(accepted=len(ids), event_ids=ids, topic=self.publisher.topic)


async def _resolve(conn: AsyncConnection, ref: str, param: str, caller: Caller) -> EntitySummary:
    """An entity by id (digits) or by the best match of its name, as the caller sees it."""
    if ref.isascii() and ref.isdigit():  # "²" is a digit to isdigit, not to int
        found = await entity_detail(conn, int(ref), 0, caller=caller)
        if found is not None:
            return EntitySummary(**found.model_dump(include=set(EntitySummary.model_fields)))
    matches = await search_entities(conn, ref, 1, caller=caller)
    if not matches:
        raise NotFound("Entity not found", f"{param}={ref!r} matches no entity")
    return matches[0]
