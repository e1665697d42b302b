"""The LLM retry policy: which errors are transient, backoff, Retry-After, giving up."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx2
import openai
import pytest

from services.core.errors import TransientError
from services.core.failures import is_transient
from services.core.llm.client import (
    MAX_BACKOFF_S,
    MAX_RETRY_AFTER_S,
    call_with_retries,
    retry_after_s,
)

REQUEST = httpx2.Request("POST", "http://llm.test/v1/chat/completions")


def status_error(status: int, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    response = httpx2.Response(status, headers=headers, request=REQUEST)
    classes: dict[int, type[openai.APIStatusError]] = {
        400: openai.BadRequestError,
        401: openai.AuthenticationError,
        403: openai.PermissionDeniedError,
        404: openai.NotFoundError,
        422: openai.UnprocessableEntityError,
        429: openai.RateLimitError,
    }
    cls = classes.get(
        status, openai.InternalServerError if status >= 500 else openai.APIStatusError
    )
    return cls(f"status {status}", response=response, body=None)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (status_error(429), True),
        (status_error(500), True),
        (status_error(502), True),
        (status_error(503), True),
        (status_error(408), True),
        (openai.APITimeoutError(request=REQUEST), True),
        (openai.APIConnectionError(request=REQUEST), True),
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (TransientError("later"), True),
        (status_error(400), False),
        (status_error(401), False),
        (status_error(403), False),
        (status_error(404), False),
        (status_error(422), False),
        (ValueError("bad"), False),
    ],
)
def test_is_transient(exc: BaseException, expected: bool) -> None:
    assert is_transient(exc) is expected


class Flaky:
    """Raises the queued errors in turn, then returns "ok"."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def recorder() -> tuple[list[float], Callable[[float], None]]:
    sleeps: list[float] = []
    return sleeps, sleeps.append


def test_success_first_time_does_not_sleep() -> None:
    sleeps, sleep = recorder()
    fn = Flaky()
    assert call_with_retries(fn, 3, sleep=sleep) == "ok"
    assert fn.calls == 1
    assert sleeps == []


def test_transient_errors_are_retried_with_growing_backoff() -> None:
    sleeps, sleep = recorder()
    fn = Flaky(status_error(500), openai.APITimeoutError(request=REQUEST), status_error(503))
    assert call_with_retries(fn, 4, base_delay=1.0, sleep=sleep) == "ok"
    assert fn.calls == 4
    # Jittered within [ceiling/2, ceiling], ceilings 1, 2, 4.
    for delay, ceiling in zip(sleeps, [1.0, 2.0, 4.0], strict=True):
        assert ceiling / 2 <= delay <= ceiling


def test_backoff_is_capped() -> None:
    sleeps, sleep = recorder()
    fn = Flaky(*[status_error(500) for _ in range(9)])
    assert call_with_retries(fn, 10, base_delay=10.0, sleep=sleep) == "ok"
    assert max(sleeps) <= MAX_BACKOFF_S


def test_exhausted_transient_error_becomes_transient_error() -> None:
    sleeps, sleep = recorder()
    last = status_error(429)
    fn = Flaky(status_error(500), status_error(500), last)
    with pytest.raises(TransientError, match="gave up after 3 attempts") as info:
        call_with_retries(fn, 3, base_delay=0.01, sleep=sleep)
    assert info.value.__cause__ is last
    assert fn.calls == 3
    assert len(sleeps) == 2


@pytest.mark.parametrize("exc", [status_error(400), status_error(401), ValueError("bug")])
def test_permanent_errors_are_reraised_at_once(exc: Exception) -> None:
    sleeps, sleep = recorder()
    fn = Flaky(exc)
    with pytest.raises(type(exc)) as info:
        call_with_retries(fn, 5, sleep=sleep)
    assert info.value is exc
    assert fn.calls == 1
    assert sleeps == []


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "0"}, 0.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "3600"}, MAX_RETRY_AFTER_S),
    ],
)
def test_retry_after_is_honoured_and_capped(headers: dict[str, str], expected: float) -> None:
    sleeps, sleep = recorder()
    fn = Flaky(status_error(429, headers))
    assert call_with_retries(fn, 2, base_delay=100.0, sleep=sleep) == "ok"
    assert sleeps == [expected]


def test_retry_after_as_http_date() -> None:
    when = datetime.now(UTC) + timedelta(seconds=20)
    seconds = retry_after_s(status_error(429, {"retry-after": format_datetime(when, usegmt=True)}))
    assert seconds is not None
    assert 15 <= seconds <= 21


def test_unparseable_retry_after_falls_back_to_backoff() -> None:
    assert retry_after_s(status_error(429, {"retry-after": "soon"})) is None
    assert retry_after_s(ValueError()) is None
    sleeps, sleep = recorder()
    fn = Flaky(status_error(503, {"retry-after": "soon"}))
    assert call_with_retries(fn, 2, base_delay=0.2, sleep=sleep) == "ok"
    assert 0.1 <= sleeps[0] <= 0.2


class Malformed(ValueError):
    pass


def test_wider_predicate_retries_and_reraises_its_own_error() -> None:
    sleeps, sleep = recorder()

    def retryable(exc: BaseException) -> bool:
        return is_transient(exc) or isinstance(exc, Malformed)

    fn = Flaky(Malformed("1"), status_error(500), Malformed("3"))
    with pytest.raises(Malformed, match="3"):
        call_with_retries(fn, 3, base_delay=0.01, retryable=retryable, sleep=sleep)
    assert fn.calls == 3

    ok = Flaky(Malformed("1"))
    assert call_with_retries(ok, 3, base_delay=0.01, retryable=retryable, sleep=sleep) == "ok"
    assert len(sleeps) == 3


def test_attempts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="attempts"):
        call_with_retries(Flaky(), 0)
