"""Reading an HTTP Retry-After header (RFC 9110): delta-seconds or an HTTP date. Shared by
the LLM client's retries (services/core/llm/client.py) and the query API's Python client
(services/client.py)."""

from __future__ import annotations

import email.utils
import math
from datetime import UTC, datetime


def retry_after_seconds(value: str | None) -> float | None:
    """The wait the header asks for, in seconds (never negative); None without a usable one
    (absent, not finite, unreadable)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # "-0000": UTC with no claim about the local zone
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    return max(seconds, 0.0) if math.isfinite(seconds) else None
