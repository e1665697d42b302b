"""What a read can refuse, as the engine says it (no HTTP here): the edge maps each to a
status (services/query_api/problems.py: 404, 422) and to an MCP tool error."""

from __future__ import annotations

from typing import Any

from services.core.errors import KgstreamError


class Refused(KgstreamError):
    """A read refused with a short title and what to do about it (``errors``: per field)."""

    def __init__(self, title: str, detail: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(detail)
        self.title, self.detail, self.errors = title, detail, errors


class NotFound(Refused):
    """What was asked for does not exist, or the caller may not see it (never which)."""


class Invalid(Refused):
    """The request cannot be answered as it is (a window, a bound, a combination)."""
