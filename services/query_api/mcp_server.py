"""kgstream for LLM agents: the Model Context Protocol server (the official ``mcp`` SDK's
MCPServer). Its tools are the query process's operations (operations.py) under the same API
keys, scopes, tenants and document ACLs as the HTTP routes: a tool runs as the caller of the
request that carried it, and refuses what the caller's key may not do.

Two transports: streamable HTTP at ``/mcp`` in the query API (``install``; stateless, JSON
responses, so any API replica answers any request), and stdio for desktop agents
(``kgstream mcp``, services/cli/mcp_stdio.py), which runs as one principal for its whole life.
Arguments are checked as the HTTP routes check their parameters (ids without control
characters, names without NUL, the same bounds); failures are the HTTP answer's status, title
and detail as a tool error (``problems.as_problem``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import UTC, date, datetime
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from pydantic import AwareDatetime, BaseModel, Field, ValidationError
from starlette.datastructures import Headers
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from services.core.settings import Settings
from services.query_api.auth import (
    PRINCIPAL_STATE,
    Authenticator,
    Principal,
    Unauthorized,
    is_loopback,
)
from services.query_api.limits import replayed
from services.query_api.operations import Operations
from services.query_api.problems import as_problem, problem
from services.retrieval.documents import DocumentRead
from services.retrieval.fact_times import MAX_FACTS
from services.retrieval.filters import Filters, scoped
from services.retrieval.plans import Plan, PlanAnswer
from services.retrieval.schemas import (
    MAX_HOPS,
    CommunitiesResponse,
    CommunityHit,
    EntityDetail,
    FactsResponse,
    Hop,
    IngestAccepted,
    Mode,
    NoControl,
    NoNul,
    PathsResponse,
    QueryRequest,
    QueryResponse,
    RequestMode,
    error_summary,
)
from services.retrieval.schemas import Context as Passage
from services.retrieval.schemas import (
    Route as GraphRoute,
)

T = TypeVar("T")
PATH = "/mcp"

# Which scope each tool needs (the HTTP route it mirrors needs the same one).
TOOL_SCOPES: Mapping[str, str] = {
    "search": "query",
    "answer": "query",
    "get_entity": "query",
    "find_paths": "query",
    "find_facts": "query",
    "graph_query": "query",
    "list_communities": "query",
    "get_document": "query",
    "ingest_documents": "ingest",
    "delete_document": "ingest",
    "status": "admin",
}

INSTRUCTIONS = """\
kgstream keeps a knowledge graph (entities, relationships, community summaries) and the
passages of a document collection up to date as documents change, and answers from it. Every
answer comes only from documents your key may read, with citations (doc_id, chunk_id).

Which tool:
- search: passages (and graph paths) for a question, for you to read and reason over. Modes:
  vector for a fact stated in one place; local for questions that chain facts across
  documents ("the director of the film that won X"); global for themes and overviews of the
  whole collection (community summaries); path for how two named things are connected;
  auto lets kgstream choose (the notes say what it chose and why).
- answer: the same retrieval plus a short answer with its supporting sources.
- get_entity, find_paths, list_communities: the graph itself; find_facts: what held when
  ("who led X in 1990", "what happened to X between 2001 and 2005").
- graph_query: questions passages cannot answer, as a typed plan over the graph: how many
  (count), which ones (list), what follows from X (impact: follow relationships up to 3
  hops), grouped by type or region, ranked by degree, two entities compared, or those NOT
  related to X. Exact over what your key may read, each row with its evidence sentence.
- get_document: a whole document's text, when a passage is not enough.
- ingest_documents, delete_document (ingest scope): change the collection. Indexing is
  asynchronous: pass an event_id they return as after_event to search or answer to read
  your own write.
- status (admin scope): the indexer's progress, lag and health.
search and answer take filters on the documents' metadata (source, author, any field) and
time (occurred_at) when the question is about some of the collection only, and as_of to read
the documents as they were at a past time (vector mode, within the retained history).
"""

_SEARCH_DOC = """\
Find passages that answer a question, from documents you may read, with the graph paths that
connect them. Returns contexts (each a passage: doc_id, chunk_id, title, text, score and why
it was chosen; cite them as [n] doc_id, n counting from 1), paths (hops: entity, relation,
entity, evidence), routes (whole paths, path mode), communities (global mode), the snapshot_id
the graph was read at, and notes on routing and fallbacks. Prefer mode local for multi-hop
questions, global for collection-wide themes, vector for single facts, path for how two named
entities connect; auto routes by the question."""

_ANSWER_DOC = """\
Answer a question from documents you may read: the search tool's retrieval plus an answer and
its support (the sources it cites as [n] doc_id, or, offline, the sentence it was read from).
abstained: true (the answer begins "I don't know") means the passages do not say: read the
contexts, or search again with another mode or other filters."""


class SearchResult(BaseModel):
    """What a search found (the HTTP query's answer without the answer)."""

    mode_used: Mode
    snapshot_id: int | None = None
    contexts: list[Passage]
    paths: list[Hop] = Field(default_factory=list)
    routes: list[GraphRoute] = Field(default_factory=list)
    communities: list[CommunityHit] = Field(default_factory=list)
    grounded_entities: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    query_id: str = ""


class AnswerResult(SearchResult):
    """An answer with what it was read from."""

    answer: str
    support: str = ""
    abstained: bool = False  # the answer says the passages do not answer the question


def _of(model: type[T], resp: QueryResponse) -> T:
    fields = set(model.model_fields)  # type: ignore[attr-defined]
    return model.model_validate(resp.model_dump(include=fields))  # type: ignore[attr-defined,no-any-return]


PrincipalOf = Callable[[Context], Principal]
# The arguments search and answer share (the SDK reads them from the signatures).
Question = Annotated[str, Field(min_length=1, description="The question.")]
ModeArg = Annotated[RequestMode, Field(description="auto|vector|local|global|path|graph")]
KArg = Annotated[int, Field(ge=1, le=50, description="Passages to retrieve.")]
LevelArg = Annotated[int | None, Field(ge=0, le=16, description="Community level (global).")]
DocId = Annotated[str, NoControl, Field(min_length=1, max_length=512, description="A doc_id.")]
EntityRef = Annotated[
    str, NoNul, Field(min_length=1, max_length=200, description="An entity id or name.")
]
AfterEvent = Annotated[
    str | None, Field(description="An event_id from ingest_documents: wait until it is indexed.")
]
AsOfArg = Annotated[
    AwareDatetime | None,
    Field(
        description="Read the documents as they were at this time (ISO 8601 with a time zone):"
        " later versions and deletes are not seen. Passages only (mode vector or auto)."
    ),
]
FiltersArg = Annotated[
    Filters | None,
    Field(
        description='Read only documents whose metadata and time match, e.g. {"metadata": '
        '{"source": "The Verge", "year": {"gte": 2020}}, "occurred_at": {"gte": "2023-11-01"}}:'
        " per field a value, a list (any of) or a range {gte, gt, lte, lt} of numbers or ISO"
        " dates; occurred_at is the document's own time."
    ),
]


def principal_from_request(ctx: Context) -> Principal:
    """The principal the HTTP endpoint (``McpEndpoint``) authenticated for this request."""
    request = ctx.request_context.request
    state = getattr(request, "scope", {}).get("state", {})
    principal = state.get(PRINCIPAL_STATE)
    if not isinstance(principal, Principal):  # the endpoint always sets it: refuse, never guess
        raise ToolError("401 Unauthorized: the request carried no authenticated caller")
    return principal


def build_server(ops: Operations, principal_of: PrincipalOf) -> MCPServer:
    """The MCP server over ``ops``; each tool runs as ``principal_of(ctx)``."""
    server: MCPServer = MCPServer(name="kgstream", instructions=INSTRUCTIONS, version="0.2.0")
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    def caller_for(tool: str, ctx: Context) -> Principal:
        principal = principal_of(ctx)
        scope = TOOL_SCOPES[tool]
        if not principal.allows(scope):
            raise ToolError(f"403 Forbidden: this API key lacks the {scope!r} scope ({tool})")
        return principal

    @server.tool(description=_SEARCH_DOC, annotations=read_only)
    async def search(
        *,
        question: Question,
        ctx: Context,
        mode: ModeArg = "auto",
        k: KArg = 5,
        level: LevelArg = None,
        after_event: AfterEvent = None,
        filters: FiltersArg = None,
        as_of: AsOfArg = None,
    ) -> SearchResult:
        principal = caller_for("search", ctx)
        req = _request(**_asked(locals()))
        resp = await _run(ops.query(req, principal.caller, answer=False))
        return _of(SearchResult, resp)

    @server.tool(description=_ANSWER_DOC, annotations=read_only)
    async def answer(
        *,
        question: Question,
        ctx: Context,
        mode: ModeArg = "auto",
        k: KArg = 5,
        level: LevelArg = None,
        after_event: AfterEvent = None,
        filters: FiltersArg = None,
        as_of: AsOfArg = None,
    ) -> AnswerResult:
        principal = caller_for("answer", ctx)
        req = _request(**_asked(locals()))
        resp = await _run(ops.query(req, principal.caller))
        return _of(AnswerResult, resp)

    @server.tool(
        description="One entity of the graph, by id or by name (the best match), with its"
        " aliases, description, mention count and strongest relationships (neighbours: name,"
        " relation, direction, weight, and the evidence sentence).",
        annotations=read_only,
    )
    async def get_entity(
        entity: EntityRef,
        ctx: Context,
        neighbours: Annotated[int, Field(ge=0, le=200, description="How many.")] = 25,
        filters: FiltersArg = None,
    ) -> EntityDetail:
        principal = caller_for("get_entity", ctx)
        caller = scoped(principal.caller, filters)
        return await _run(ops.entity_by_ref(entity, neighbours, caller))

    @server.tool(
        description="How two entities are connected: the k shortest paths of at most max_hops"
        " relationships between them (by id or name), hop by hop with the evidence sentence"
        " of each relationship. Use it to explain or verify a connection.",
        annotations=read_only,
    )
    async def find_paths(
        *,
        source: EntityRef,
        target: EntityRef,
        ctx: Context,
        k: Annotated[int, Field(ge=1, le=10)] = 3,
        max_hops: Annotated[int, Field(ge=1, le=MAX_HOPS)] = MAX_HOPS,
        filters: FiltersArg = None,
    ) -> PathsResponse:
        principal = caller_for("find_paths", ctx)
        caller = scoped(principal.caller, filters)
        return await _run(ops.paths(source, target, k, max_hops, caller))

    @server.tool(
        description="A typed graph plan (schemas/graph_plan.v1.json): start from entities by"
        " name or type, follow relationships (types, direction out/in/both, depth; at most 3"
        " hops in all), keep types (where.types) or those that have or lack a relationship"
        " (where.has / where.lacks: 'the suppliers', 'with no contract'; to_types: of"
        " these entity types only), drop what is one step"
        " from named entities"
        " (exclude: negation), then count, list (limit/offset), group (by type, or by the"
        " entity each is related to), rank (by degree over a relationship, mentions, or"
        " PageRank) or compare two named entities. Example, 'How many companies are in"
        " APAC?': {start: {names: [APAC]}, follow: [{relationships: [LOCATED_IN], direction:"
        " in}], where: {types: [ORG]}, result: {op: count}}. Rows carry evidence (doc_id,"
        " sentence); notes say which names matched nothing. Relationship and entity types"
        " are those get_entity shows.",
        annotations=read_only,
    )
    async def graph_query(plan: Plan, ctx: Context, filters: FiltersArg = None) -> PlanAnswer:
        principal = caller_for("graph_query", ctx)
        caller = scoped(principal.caller, filters)
        return await _run(ops.graph_query(plan, caller))

    @server.tool(
        description="Time-scoped facts: sentences of the documents that state when something"
        " held, with the span of days [valid_from, valid_to) they state (null: open), the"
        " entities they name and the relationships they are evidence of. Of one entity (by"
        " id or name) or of the whole graph; those that held on a day (at) or met days"
        " [from_date, to_date] (ISO dates); optionally of one relationship type. Use it for"
        " 'who held X in 1990' or 'what did X do between 2001 and 2005'.",
        annotations=read_only,
    )
    async def find_facts(
        *,
        ctx: Context,
        entity: EntityRef | None = None,
        at: Annotated[date | None, Field(description="Facts that held on this day.")] = None,
        from_date: Annotated[date | None, Field(description="Held on or after it.")] = None,
        to_date: Annotated[date | None, Field(description="Held on or before it.")] = None,
        relation: Annotated[
            str | None, Field(min_length=1, max_length=100, description="A relationship type.")
        ] = None,
        limit: Annotated[int, Field(ge=1, le=MAX_FACTS)] = 50,
        filters: FiltersArg = None,
    ) -> FactsResponse:
        principal = caller_for("find_facts", ctx)
        caller = scoped(principal.caller, filters)
        return await _run(ops.facts(entity, at, from_date, to_date, relation, limit, caller))

    @server.tool(
        description="The communities (clusters of related entities, with a title, a summary"
        " and a rating) of the published snapshot, best rated first: an overview of what the"
        " collection is about. Level 0 is the coarsest; deeper levels are finer.",
        annotations=read_only,
    )
    async def list_communities(
        ctx: Context,
        level: Annotated[int | None, Field(ge=0, le=16, description="Omit for all.")] = None,
        limit: Annotated[int, Field(ge=1, le=1000)] = 100,
    ) -> CommunitiesResponse:
        principal = caller_for("list_communities", ctx)
        return await _run(ops.communities(level, limit, principal.caller))

    @server.tool(
        description="A whole document by doc_id, as indexed: title, metadata, version, time"
        " and text. Use it when a passage from search is not enough context.",
        annotations=read_only,
    )
    async def get_document(doc_id: DocId, ctx: Context) -> DocumentRead:
        principal = caller_for("get_document", ctx)
        return await _run(ops.document(doc_id, principal.caller))

    @server.tool(
        description="Add or replace documents (ingest scope). Each is a kgstream document"
        " event: doc_id and text are required; title, metadata (an object), acl (groups that"
        " may read it), tenant and version (an integer that only grows per doc_id) are"
        " optional. event_id, type (upsert) and occurred_at (now) are filled in when absent."
        " Facts you already know can go with it (schema_version 2): entities (name, type such"
        " as PERSON or ORG, aliases) and relationships (source, target, type, weight), and"
        " extraction: provided to skip reading the text for more."
        " All or none are accepted; indexing is asynchronous: pass a returned event_id as"
        " after_event to search or answer to read your own write.",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
    )
    async def ingest_documents(
        documents: Annotated[
            list[dict[str, Any]], Field(min_length=1, description="Document events.")
        ],
        ctx: Context,
    ) -> IngestAccepted:
        principal = caller_for("ingest_documents", ctx)
        return await _run(ops.ingest([_filled(d) for d in documents], principal.caller))

    @server.tool(
        description="Delete a document (ingest scope): it and everything only it supported"
        " leave the graph once indexed. Returns the delete event's id.",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True),
    )
    async def delete_document(doc_id: DocId, ctx: Context) -> IngestAccepted:
        principal = caller_for("delete_document", ctx)
        return await _run(ops.delete(doc_id, principal.caller))

    @server.tool(
        description="The service's state (admin scope): documents, entities, the published"
        " snapshot, the indexer's progress, lag and stalls, dead letters and recent activity.",
        annotations=read_only,
    )
    async def status(ctx: Context) -> dict[str, Any]:
        caller_for("status", ctx)
        return await _run(ops.status())

    return server


def _asked(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The QueryRequest fields among a tool's arguments (search's and answer's)."""
    names = ("question", "mode", "k", "level", "after_event", "filters", "as_of")
    return {name: arguments[name] for name in names}


def _request(**fields: Any) -> QueryRequest:
    try:
        return QueryRequest(**fields)
    except ValidationError as exc:
        raise ToolError(f"422 Invalid request: {error_summary(exc)}") from None


def _filled(event: dict[str, Any]) -> dict[str, Any]:
    """An agent's document with the event fields it may leave out filled in."""
    filled = {"type": "upsert", **event}
    filled.setdefault("event_id", f"mcp-{uuid.uuid4()}")
    filled.setdefault("occurred_at", datetime.now(UTC).isoformat())
    return filled


async def _run(work: Awaitable[T]) -> T:
    """The operation's result, or a tool error saying what an HTTP caller would be told."""
    try:
        return await work
    except Exception as exc:
        found = as_problem(exc)
        if found is None:
            raise  # unexpected: the SDK logs it and says only that the tool failed
        message = f"{found.status} {found.title}: {found.detail}"
        if found.extra.get("errors"):
            message += " " + json.dumps(found.extra["errors"], ensure_ascii=False, default=str)
        if found.status in (409, 429, 503):
            message += " (retry in a moment)"
        raise ToolError(message) from None


class McpEndpoint:
    """``/mcp`` in the query API: authenticates the request with the API's own keys (401
    with ``WWW-Authenticate: Bearer`` without a usable one), refuses a ``tools/call`` whose
    tool needs a scope the key lacks (403, ``error="insufficient_scope"``, as the MCP
    authorization spec asks), and hands the rest to the SDK's session manager with the
    principal in the request's state, where the tools find it."""

    def __init__(self, server: MCPServer, authenticator: Authenticator) -> None:
        self.server, self.authenticator = server, authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope.setdefault("state", {})
        principal = state.get(PRINCIPAL_STATE)
        try:
            if not isinstance(principal, Principal) or (
                principal.key is None and self.authenticator.required
            ):
                authorization = Headers(scope=scope).get("authorization")
                principal = await self.authenticator.principal(authorization)
        except Unauthorized as exc:
            challenge = {"WWW-Authenticate": exc.challenge}
            await problem(401, exc.title, exc.detail, PATH, challenge)(scope, receive, send)
            return
        state[PRINCIPAL_STATE] = principal
        if scope["method"] == "POST":
            body = await _read_body(receive)
            if body is None:
                return  # the client went away before its request was in
            refused = _refused_tool(body, principal)
            if refused is not None:
                tool, needed = refused
                challenge = {
                    "WWW-Authenticate": f'Bearer realm="kgstream", error="insufficient_scope",'
                    f' scope="{needed}"'
                }
                detail = f"this API key lacks the {needed!r} scope ({tool})"
                await problem(403, "Forbidden", detail, PATH, challenge)(scope, receive, send)
                return
            receive = replayed(body, receive)
        await self.server.session_manager.handle_request(scope, receive, send)


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body (admission has read it, bounded by BodyLimits, and replays it in
    one message); None when the client disconnected first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _refused_tool(body: bytes, principal: Principal) -> tuple[str, str] | None:
    """(tool, scope) of the first tools/call in the body the principal may not make."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None  # the SDK answers the parse error
    for message in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(message, dict) or message.get("method") != "tools/call":
            continue
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        needed = TOOL_SCOPES.get(name) if isinstance(name, str) else None
        if needed is not None and not principal.allows(needed):
            return str(name), needed
    return None


def http_server(ops: Operations, *, loopback: bool, max_bytes: int) -> MCPServer:
    """The server for ``/mcp``: stateless, JSON responses; on a loopback bind the SDK's DNS
    rebinding protection admits only local Host and Origin headers (a web page must not
    reach a local, keyless API through the browser)."""
    server = build_server(ops, principal_from_request)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=loopback,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"] if loopback else [],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
        if loopback
        else [],
    )
    # Builds the session manager; the Starlette app it returns is not used (McpEndpoint is).
    server.streamable_http_app(
        streamable_http_path=PATH,
        stateless_http=True,
        json_response=True,
        transport_security=security,
        max_request_body_size=max_bytes,  # KGSTREAM_API_MAX_BODY_BYTES, not the SDK's 4 MiB
    )
    return server


def install(app: FastAPI, ops: Operations, settings: Settings) -> MCPServer:
    """Serve the MCP server at ``PATH`` in the query API (after ``auth.install``); the API's
    lifespan runs ``running(server)``."""
    server = http_server(
        ops, loopback=is_loopback(settings.api_host), max_bytes=settings.api_max_body_bytes
    )
    endpoint = McpEndpoint(server, app.state.authenticator)
    # A Route whose endpoint is not a function is served as an ASGI app.
    app.router.routes.append(
        # POST only: the stateless server has no stream to GET nor session to DELETE (405)
        Route(PATH, endpoint, methods=["POST"], include_in_schema=False)
    )
    return server


def running(server: MCPServer) -> AbstractAsyncContextManager[None]:
    """The session manager's task group, for the API's lifespan."""
    return server.session_manager.run()
