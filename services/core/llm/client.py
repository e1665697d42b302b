"""The OpenAI client and our own retry loop around it (the SDK's retries are switched off so
that one policy, with one attempt budget, covers every LLM call)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

import openai

from services.core.errors import TransientError
from services.core.failures import is_transient
from services.core.retry_after import retry_after_seconds
from services.core.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

# A server asking for a longer pause than this is better served by the indexer's own retry of
# the whole event (the offset stays uncommitted) than by a worker thread sleeping.
MAX_RETRY_AFTER_S = 30.0
MAX_BACKOFF_S = 20.0


def process_client(settings: Settings) -> openai.OpenAI | None:
    """The process's one client (composition roots call this once), or None when offline."""
    return make_openai_client(settings) if settings.openai_base_url else None


def make_openai_client(settings: Settings) -> openai.OpenAI:
    """A synchronous client for the configured endpoint, without SDK-level retries: every call
    goes through ``call_with_retries`` with the transient/permanent predicate."""
    return openai.OpenAI(
        base_url=settings.openai_base_url,
        api_key=settings.openai_api_key.get_secret_value(),
        timeout=settings.llm_timeout_s,
        max_retries=0,
    )


def retry_after_s(exc: BaseException) -> float | None:
    """The pause the server asked for (Retry-After / retry-after-ms), if any."""
    if not isinstance(exc, openai.APIStatusError):
        return None
    headers = exc.response.headers
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    return retry_after_seconds(headers.get("retry-after"))


def call_with_retries(
    fn: Callable[[], T],
    attempts: int,
    base_delay: float = 0.5,
    *,
    retryable: Callable[[BaseException], bool] = is_transient,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn`` up to ``attempts`` times, retrying errors ``retryable`` accepts.

    Waits with exponential backoff and jitter, or the server's Retry-After (capped at
    MAX_RETRY_AFTER_S). When the attempts run out on a transient error, raises TransientError
    (the caller retries the whole unit of work later); any other error, including a
    non-transient one ``retryable`` accepted, is re-raised as it is.
    """
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if not retryable(exc):
                raise
            if attempt == attempts:
                if is_transient(exc):
                    raise TransientError(
                        f"gave up after {attempts} attempts: {type(exc).__name__}: {exc}"
                    ) from exc
                raise
            delay = _delay(exc, attempt, base_delay)
            log.info(
                "LLM call failed (%s), attempt %d/%d, retrying in %.2fs",
                type(exc).__name__,
                attempt,
                attempts,
                delay,
            )
            sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def _delay(exc: BaseException, attempt: int, base_delay: float) -> float:
    asked = retry_after_s(exc)
    if asked is not None:
        return min(asked, MAX_RETRY_AFTER_S)
    ceiling: float = min(MAX_BACKOFF_S, base_delay * 2.0 ** (attempt - 1))
    # Jitter, so workers hitting the same rate limit do not retry in lockstep.
    return ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 - jitter, not security
