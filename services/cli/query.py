"""`kgstream query`: through the query API when one answers on api_host:api_port, else straight
from the database; the JSON is the API's QueryResponse either way."""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy.engine import make_url

from services.core.access import Caller
from services.core.db.engine import check_schema
from services.core.errors import KgstreamError
from services.core.infra.errors import InfraError
from services.core.infra.manager import resolve_endpoints
from services.core.settings import Settings
from services.retrieval.compose import build_service
from services.retrieval.schemas import QueryRequest, QueryResponse


class ApiError(KgstreamError):
    """The API answered the query with an error (its problem detail is the message)."""


def api_url(settings: Settings) -> str:
    """Base URL of the local query API."""
    host = "127.0.0.1" if settings.api_host in ("0.0.0.0", "::") else settings.api_host  # noqa: S104
    return f"http://{host}:{settings.api_port}"


def api_ready(settings: Settings) -> bool:
    """/readyz answers 200 within the probe timeout, for the database this CLI would read
    (an API on the port that serves another database is not ours to ask)."""
    try:
        resp = httpx.get(f"{api_url(settings)}/readyz", timeout=settings.query_api_probe_s)
    except httpx.HTTPError:
        return False
    if resp.status_code != 200:
        return False
    try:
        ours = resolve_endpoints(settings).database_url
    except InfraError:
        return True  # no database of our own to compare with: the API is the only way
    served = resp.json().get("database")
    return served is None or served == make_url(ours).render_as_string(hide_password=True)


def api_headers(settings: Settings) -> dict[str, str]:
    """``Authorization: Bearer KGSTREAM_API_KEY`` when that key is set."""
    if settings.api_key is None:
        return {}
    return {"Authorization": f"Bearer {settings.api_key.get_secret_value()}"}


def query_via_api(settings: Settings, req: QueryRequest) -> QueryResponse:
    """POST /v1/query, with the configured API key."""
    resp = httpx.post(
        f"{api_url(settings)}/v1/query",
        json=req.model_dump(mode="json", exclude_none=True),
        headers=api_headers(settings),
        timeout=300,
    )
    if resp.status_code != 200:
        raise refusal(resp)
    return QueryResponse.model_validate(resp.json())


def refusal(resp: httpx.Response) -> ApiError:
    """The API's refusal as an error that says what it said (and what to set for a 401)."""
    try:
        detail = resp.json().get("detail", resp.text)
    except ValueError:
        detail = resp.text
    if resp.status_code in (401, 403):
        detail += " (set KGSTREAM_API_KEY to a key with the query scope)"
    return ApiError(f"query API answered {resp.status_code}: {detail}")


def query_direct(settings: Settings, req: QueryRequest) -> QueryResponse:
    """Build the service in-process and ask the database."""
    service = build_service(settings, resolve_endpoints(settings).database_url)

    async def go() -> QueryResponse:
        try:
            await check_schema(service.engine, settings.embedding_dim)
            return await service.query(req, Caller.operator())
        finally:
            await service.engine.dispose()

    return asyncio.run(go())


def run_query(settings: Settings, req: QueryRequest) -> tuple[QueryResponse, str]:
    """(response, "api" | "database")."""
    if api_ready(settings):
        return query_via_api(settings, req), "api"
    return query_direct(settings, req), "database"


def filters_from_options(
    where: list[str], since: str | None, until: str | None, filters_json: str | None
) -> dict[str, object] | None:
    """`kgstream query`'s filter options as the request's ``filters``: ``--filters`` (a JSON
    object) with ``--where FIELD=VALUE`` (repeated for the same field: any of them; a value
    that reads as a JSON number or boolean is one) and ``--since`` / ``--until`` (occurred_at,
    both days included) on top. Raises ValueError on a malformed option."""
    import json

    filters: dict[str, object] = {}
    if filters_json:
        loaded = json.loads(filters_json)
        if not isinstance(loaded, dict):
            raise ValueError("--filters takes a JSON object")
        filters = loaded
    metadata = dict(filters.get("metadata") or {})  # type: ignore[call-overload]
    for clause in where:
        field, sep, raw = clause.partition("=")
        if not sep or not field.strip():
            raise ValueError(f"--where takes FIELD=VALUE, not {clause!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if not isinstance(value, (int, float, bool)):
            value = raw
        field = field.strip()
        if field in metadata:
            before = metadata[field]
            metadata[field] = [*(before if isinstance(before, list) else [before]), value]
        else:
            metadata[field] = value
    if metadata:
        filters["metadata"] = metadata
    window = {k: v for k, v in (("gte", since), ("lte", until)) if v}
    if window:
        filters["occurred_at"] = {**dict(filters.get("occurred_at") or {}), **window}  # type: ignore[call-overload]
    return filters or None
