"""Errors as RFC 9457 problem details (application/problem+json), for every failure the API can
answer: request validation, HTTP errors, our own problems, configuration and database outages."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.exceptions import HTTPException

from services.core.errors import ConfigurationError, TransientError
from services.retrieval.as_of import HistoryNotKept
from services.retrieval.errors import NotFound, Refused
from services.retrieval.replicas import NotCaughtUp

log = logging.getLogger(__name__)
PROBLEM_JSON = "application/problem+json"
RETRY_AFTER_S = 1  # what a 429 or 503 asks the client to wait


class Problem(Exception):
    """An error the API answers as problem+json (``headers``: e.g. Retry-After)."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail, self.extra = status, title, detail, extra
        self.headers = dict(headers or {})


class ProblemResponse(JSONResponse):
    """application/problem+json that renders whatever the input held: a lone surrogate echoed
    from a request (an event_id, say) becomes U+FFFD instead of an encoding error."""

    media_type = PROBLEM_JSON

    def render(self, content: Any) -> bytes:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8", "replace")


def problem(
    status: int,
    title: str,
    detail: str,
    instance: str,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> ProblemResponse:
    """The problem document for a request to the path ``instance``."""
    body = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
        "instance": instance,
        **extra,
    }
    return ProblemResponse(body, status_code=status, headers=dict(headers or {}))


def problem_response(
    request: Request, status: int, title: str, detail: str, **extra: Any
) -> JSONResponse:
    """The problem document."""
    return problem(status, title, detail, request.url.path, **extra)


def as_problem(exc: BaseException) -> Problem | None:
    """The problem a known failure is answered with, over HTTP and MCP alike; None for an
    unexpected one (a 500 that only the log explains)."""
    if isinstance(exc, Problem):
        return exc
    if isinstance(exc, Refused | HistoryNotKept | NotCaughtUp):
        return _refused(exc)
    if isinstance(exc, TransientError):
        retry = {"Retry-After": str(RETRY_AFTER_S)}
        return Problem(503, "Service unavailable", str(exc)[:300], headers=retry)
    if isinstance(exc, ConfigurationError):
        return Problem(503, "Service misconfigured", str(exc))
    if isinstance(exc, OperationalError):
        return Problem(503, "Database unavailable", str(exc.orig)[:300])
    return None


def _refused(exc: Refused | HistoryNotKept | NotCaughtUp) -> Problem:
    """The engine's refusals: what is not there (404) or cannot be asked so (422), and a
    state the read cannot reach (before the history kept, or not replicated yet)."""
    if isinstance(exc, Refused):
        status = 404 if isinstance(exc, NotFound) else 422
        extra: dict[str, Any] = {"errors": exc.errors} if exc.errors else {}
        return Problem(status, exc.title, exc.detail, **extra)
    if isinstance(exc, HistoryNotKept):
        since = exc.kept_since.isoformat() if exc.kept_since else None
        return Problem(422, "History not kept", str(exc), kept_since=since)
    return Problem(
        409,
        "Not caught up",
        str(exc),
        waited_for=exc.waited_for,
        waited_s=exc.waited_s,
        seen_snapshot=exc.seen_snapshot,
    )


def validation_errors(errors: Sequence[Any]) -> list[dict[str, str]]:
    """Pydantic/FastAPI errors as {"field", "message"} with a dotted location."""
    out = []
    for e in errors:
        loc = [str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path")]
        out.append({"field": ".".join(loc) or "body", "message": str(e.get("msg", "invalid"))})
    return out


def install(app: FastAPI) -> None:
    """Register the handlers on the app."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = validation_errors(exc.errors())
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return problem_response(request, 422, "Invalid request", detail, errors=errors)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        phrase = HTTPStatus(exc.status_code).phrase
        detail = str(exc.detail or phrase)
        return problem(exc.status_code, phrase, detail, request.url.path, exc.headers)

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return problem(
            exc.status, exc.title, exc.detail, request.url.path, exc.headers, **exc.extra
        )

    async def _known(request: Request, exc: Exception) -> JSONResponse:
        # registered only for the classes as_problem knows
        found = as_problem(exc) or Problem(500, "Internal error", "see the service log")
        if found.status == 503 and not isinstance(exc, ConfigurationError):
            log.warning("unavailable on %s: %s", request.url.path, found.detail)
        return problem(
            found.status, found.title, found.detail, request.url.path, found.headers, **found.extra
        )

    for known in (
        Refused,
        HistoryNotKept,
        NotCaughtUp,
        TransientError,
        ConfigurationError,
        OperationalError,
    ):
        app.add_exception_handler(known, _known)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s", request.url.path, exc_info=exc)
        return problem_response(request, 500, "Internal error", "see the service log")

    @app.exception_handler(DBAPIError)
    async def _db_error(request: Request, exc: DBAPIError) -> JSONResponse:
        log.exception("database error")
        return problem_response(request, 500, "Database error", type(exc.orig).__name__)
