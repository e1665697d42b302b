"""A typed Python client of the query API (httpx): query, graph look-ups, documents, ingest,
status and curations, answered as the API's own pydantic models, with retries on 429 and 503
that honour Retry-After, and on connection failures. ``Client`` blocks; ``AsyncClient`` is the
same API for asyncio code.

    from services.client import Client

    with Client("http://127.0.0.1:8000", api_key="kgs_...") as kg:
        accepted = kg.ingest([{"doc_id": "memo-1", "text": "..."}])
        answer = kg.query("Who wrote the memo?", after_event=accepted.event_ids[-1])

Retried (``Retry``): a 429, refused before any work, always; a 503 and a connection lost
before the answer for every call but a delete, because they are safe to repeat (queries and
look-ups read; ingest sends events whose ids make a replay a no-op; a curation made twice is
the one in force), while a second delete would be "gone as of" a later time, over an upsert
made in between; a connection never made, always; a read timeout never (the work may still
run). An answer the API refuses is raised as
``ApiError`` with the problem document's status, title, detail and per-item errors."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from types import TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, cast
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from services.core.retry_after import retry_after_seconds
from services.retrieval.documents import DocumentRead
from services.retrieval.plans import Plan, PlanAnswer
from services.retrieval.schemas import (
    MAX_HOPS,
    CommunitiesResponse,
    CurationOut,
    CurationsResponse,
    EntityDetail,
    FactsResponse,
    FeedbackResponse,
    IngestAccepted,
    PathsResponse,
    QueryResponse,
    RequestMode,
)

T = TypeVar("T")
P = ParamSpec("P")
RETRIED = frozenset({429, 503})


class ApiError(Exception):
    """The API refused the call (a problem document: RFC 9457)."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        errors: Sequence[Any] = (),
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {title}: {detail}")
        self.status, self.title, self.detail = status, title, detail
        self.errors, self.retry_after = list(errors), retry_after


@dataclass(frozen=True)
class Retry:
    """How calls are retried: up to ``attempts`` tries in all; a 429 or 503 waits what its
    Retry-After says (at most ``max_wait_s``), anything else retried (a connection failure,
    a 429/503 without the header) waits ``base_s`` doubled per try, with jitter."""

    attempts: int = 5
    base_s: float = 0.5
    max_wait_s: float = 30.0

    def wait(
        self,
        attempt: int,
        call: Call[Any],
        response: httpx.Response | None = None,
        error: httpx.TransportError | None = None,
    ) -> float | None:
        """Seconds to wait before trying ``call`` again after try ``attempt`` (0-based)
        answered ``response`` or failed with ``error``; None: this outcome stands. Retried:
        a 429 (refused before any work); a 503 when the call is repeatable; a connection that
        was never made; a connection lost before the answer when the call is repeatable.
        Never a read timeout: the work (an LLM answer, say) may be running still."""
        if attempt >= self.attempts - 1:
            return None
        if error is not None:
            sent = not isinstance(error, httpx.ConnectError | httpx.ConnectTimeout)
            lost = isinstance(error, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError)
            if sent and not (lost and call.repeatable):
                return None
            return self.delay(attempt, None)
        if response is None:
            return None
        if response.status_code == 429 or (response.status_code == 503 and call.repeatable):
            return self.delay(attempt, retry_after(response))
        return None

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """The wait: Retry-After's (capped), else backoff with jitter."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_wait_s)
        backoff = self.base_s * 2**attempt
        return float(min(backoff * (0.5 + random.random() / 2), self.max_wait_s))  # noqa: S311 - jitter


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and the model its answer is read as (``None``: the JSON as it is)."""

    method: str
    path: str
    params: Mapping[str, Any] = field(default_factory=dict)
    json: Any = None
    model: type[BaseModel] | None = None
    # Whether the call may be sent again after it may have been received: every call but a
    # delete (a second delete is "gone as of" a later time, over an upsert made meanwhile).
    repeatable: bool = True

    def settle(self, response: httpx.Response) -> T:
        """The answer as the call's model, or ApiError for a refusal."""
        if response.is_error:
            raise _refusal(response)
        body = response.json()
        return cast(T, body if self.model is None else self.model.model_validate(body))


# What each method sends: the signatures (and docs) of both clients' methods.


def query(
    question: str,
    *,
    mode: RequestMode = "auto",
    k: int = 5,
    level: int | None = None,
    explain: bool = True,
    min_snapshot: int | None = None,
    after_event: str | None = None,
    filters: dict[str, Any] | None = None,
    as_of: datetime | None = None,
) -> Call[QueryResponse]:
    """Answer a question from what the key may read (POST /v1/query). ``after_event``: an
    event id you published; the answer waits until it is indexed (read your own write).
    ``filters``: only documents whose metadata and occurred_at match, e.g.
    ``{"metadata": {"source": "The Verge"}, "occurred_at": {"gte": "2023-11-01"}}``.
    ``as_of``: an aware time; the documents as they were then (vector mode)."""
    body = {"question": question, "mode": mode, "k": k, "explain": explain}
    body |= {"level": level, "min_snapshot": min_snapshot, "after_event": after_event}
    body |= {"filters": filters, "as_of": as_of.isoformat() if as_of else None}
    body = {name: value for name, value in body.items() if value is not None}
    return Call("POST", "/v1/query", json=body, model=QueryResponse)


def feedback(query_id: str, useful: bool) -> Call[FeedbackResponse]:
    """Whether an answer was useful (POST /v1/feedback)."""
    body = {"query_id": query_id, "useful": useful}
    return Call("POST", "/v1/feedback", json=body, model=FeedbackResponse)


def entities(name: str, *, limit: int = 10) -> Call[dict[str, Any]]:
    """Entities whose name or alias matches, best first (GET /v1/entities)."""
    return Call("GET", "/v1/entities", params={"name": name, "limit": limit})


def entity(entity_id: int, *, neighbours: int = 25) -> Call[EntityDetail]:
    """One entity with its strongest relationships (GET /v1/entities/{id})."""
    params = {"neighbours": neighbours}
    return Call("GET", f"/v1/entities/{entity_id}", params=params, model=EntityDetail)


def paths(source: str, target: str, *, k: int = 3, max_hops: int = MAX_HOPS) -> Call[PathsResponse]:
    """k shortest paths between two entities, by id or name (GET /v1/paths)."""
    params = {"from": source, "to": target, "k": k, "max_hops": max_hops}
    return Call("GET", "/v1/paths", params=params, model=PathsResponse)


def graph_query(
    plan: Plan | Mapping[str, Any], *, filters: Mapping[str, Any] | None = None
) -> Call[PlanAnswer]:
    """A typed graph plan's answer (POST /v1/graph/query; schemas/graph_plan.v1.json): count,
    list, group, rank or compare what the key may read, each row with its evidence. ``plan``:
    a ``Plan`` or its JSON, e.g. ``{"start": {"names": ["APAC"]}, "follow": [{"relationships":
    ["LOCATED_IN"], "direction": "in"}], "result": {"op": "count"}}``. Checked here first, so a
    bad plan is a ValidationError before anything is sent."""
    body = Plan.model_validate(plan).model_dump(mode="json", exclude_defaults=True)
    params = {} if filters is None else {"filters": json.dumps(dict(filters))}
    return Call("POST", "/v1/graph/query", params=params, json=body, model=PlanAnswer)


def facts(
    entity: str | None = None,
    *,
    at: date | str | None = None,
    since: date | str | None = None,
    until: date | str | None = None,
    relation: str | None = None,
    limit: int = 50,
) -> Call[FactsResponse]:
    """Time-scoped facts of an entity (by id or name) or of the graph: those that held on a
    day (``at``) or met days [since, until] (GET /v1/facts)."""
    given = {"entity": entity, "at": at, "from": since, "to": until, "type": relation}
    params: dict[str, Any] = {k: str(v) for k, v in given.items() if v is not None}
    return Call("GET", "/v1/facts", params={**params, "limit": limit}, model=FactsResponse)


def communities(*, level: int | None = None, limit: int = 100) -> Call[CommunitiesResponse]:
    """Communities of the published snapshot, best rated first (GET /v1/communities)."""
    params: dict[str, Any] = {"limit": limit} | ({} if level is None else {"level": level})
    return Call("GET", "/v1/communities", params=params, model=CommunitiesResponse)


def document(doc_id: str) -> Call[DocumentRead]:
    """A live document the key may read, with its text (GET /v1/documents/{doc_id})."""
    return Call("GET", f"/v1/documents/{_segment(doc_id)}", model=DocumentRead)


def ingest(events: Sequence[Mapping[str, Any]]) -> Call[IngestAccepted]:
    """Publish document events, all or none (POST /v1/documents). An event without
    ``event_id``, ``type`` or ``occurred_at`` gets a fresh id, "upsert" and now: the ids are
    fixed here, once, so a retried call sends the same events."""
    filled = [
        {
            "event_id": f"client-{uuid.uuid4()}",
            "type": "upsert",
            "occurred_at": datetime.now(UTC).isoformat(),
            **event,
        }
        for event in events
    ]
    return Call("POST", "/v1/documents", json=filled, model=IngestAccepted)


def delete(doc_id: str) -> Call[IngestAccepted]:
    """Publish "this document is gone as of now" (DELETE /v1/documents/{doc_id})."""
    return Call(
        "DELETE", f"/v1/documents/{_segment(doc_id)}", model=IngestAccepted, repeatable=False
    )


def status() -> Call[dict[str, Any]]:
    """The service's status document (GET /v1/status, admin scope)."""
    return Call("GET", "/v1/status")


def curations() -> Call[CurationsResponse]:
    """Every curation, oldest first (GET /v1/curations, admin scope)."""
    return Call("GET", "/v1/curations", model=CurationsResponse)


def curate(kind: str, name: str, other: str, *, reason: str = "") -> Call[CurationOut]:
    """Make a rule about entity resolution: merge, alias, block, split or rename (POST
    /v1/curations, admin scope). The same rule again answers the one in force."""
    body = {"kind": kind, "name": name, "other": other, "reason": reason}
    return Call("POST", "/v1/curations", json=body, model=CurationOut)


def undo(curation_id: int, *, reason: str = "") -> Call[CurationOut]:
    """Take a rule out of force (POST /v1/curations/{id}/undo, admin scope)."""
    body = {"reason": reason}
    return Call("POST", f"/v1/curations/{curation_id}/undo", json=body, model=CurationOut)


def _segment(doc_id: str) -> str:
    """``doc_id`` as one path segment: every reserved character quoted, and the dots of "."
    and ".." too, which URL normalisation would otherwise resolve away."""
    quoted = quote(doc_id, safe="")
    return quoted.replace(".", "%2E") if set(doc_id) == {"."} else quoted


def _refusal(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    return ApiError(
        response.status_code,
        str(body.get("title", response.reason_phrase)),
        str(body.get("detail", response.text[:500])),
        body.get("errors") or (),
        retry_after(response),
    )


def retry_after(response: httpx.Response) -> float | None:
    """Retry-After in seconds: delta-seconds or an HTTP date (RFC 9110); None without a
    usable one (absent, not finite, unreadable)."""
    return retry_after_seconds(response.headers.get("retry-after"))


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _sync(build: Callable[P, Call[T]]) -> Callable[Concatenate[Client, P], T]:
    @functools.wraps(build)
    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.send(build(*args, **kwargs))

    return method


def _async(build: Callable[P, Call[T]]) -> Callable[Concatenate[AsyncClient, P], Awaitable[T]]:
    @functools.wraps(build)
    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.send(build(*args, **kwargs))

    return method


class Client:
    """The query API, blocking. ``transport``: an httpx transport (tests, proxies)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        retry: Retry | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.retry = retry or Retry()
        self._http = httpx.Client(
            base_url=base_url, headers=_headers(api_key), timeout=timeout, transport=transport
        )

    def send(self, call: Call[T]) -> T:
        """Make the call, retrying as ``retry`` says; its answer, or ApiError."""
        for attempt in itertools.count():
            try:
                response = self._http.request(
                    call.method, call.path, params=call.params, json=call.json
                )
            except httpx.TransportError as exc:
                if (wait := self.retry.wait(attempt, call, error=exc)) is None:
                    raise
            else:
                if (wait := self.retry.wait(attempt, call, response)) is None:
                    return call.settle(response)
            time.sleep(wait)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    query = _sync(query)
    feedback = _sync(feedback)
    entities = _sync(entities)
    entity = _sync(entity)
    paths = _sync(paths)
    graph_query = _sync(graph_query)
    facts = _sync(facts)
    communities = _sync(communities)
    document = _sync(document)
    ingest = _sync(ingest)
    delete = _sync(delete)
    status = _sync(status)
    curations = _sync(curations)
    curate = _sync(curate)
    undo = _sync(undo)


class AsyncClient:
    """The query API for asyncio code: ``Client``'s methods, awaited."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        retry: Retry | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.retry = retry or Retry()
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=_headers(api_key), timeout=timeout, transport=transport
        )

    async def send(self, call: Call[T]) -> T:
        """Make the call, retrying as ``retry`` says; its answer, or ApiError."""
        for attempt in itertools.count():
            try:
                response = await self._http.request(
                    call.method, call.path, params=call.params, json=call.json
                )
            except httpx.TransportError as exc:
                if (wait := self.retry.wait(attempt, call, error=exc)) is None:
                    raise
            else:
                if (wait := self.retry.wait(attempt, call, response)) is None:
                    return call.settle(response)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    query = _async(query)
    feedback = _async(feedback)
    entities = _async(entities)
    entity = _async(entity)
    paths = _async(paths)
    graph_query = _async(graph_query)
    facts = _async(facts)
    communities = _async(communities)
    document = _async(document)
    ingest = _async(ingest)
    delete = _async(delete)
    status = _async(status)
    curations = _async(curations)
    curate = _async(curate)
    undo = _async(undo)
