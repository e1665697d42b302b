"""The typed client's retries and errors, against httpx's mock transport (the integration test
runs it against the real API): 429 and 503 wait what Retry-After says (seconds or an HTTP
date), backoff without it, connection failures are retried, the last answer is raised, a
refusal is raised at once with the problem document, and a retried ingest resends the same
event ids."""

from __future__ import annotations

import email.utils
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from services.client import ApiError, AsyncClient, Client, Retry

Handler = Callable[[httpx.Request], httpx.Response]
ANSWER = {"answer": "Paris", "mode_used": "vector", "contexts": []}


def scripted(*responses: httpx.Response | Exception) -> tuple[Handler, list[httpx.Request]]:
    seen: list[httpx.Request] = []
    pending = list(responses)

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        step = pending.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    return handle, seen


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr("services.client.time.sleep", slept.append)
    return slept


def make(handler: Handler, **retry: float) -> Client:
    return Client(
        "http://api",
        api_key="kgs_test",
        retry=Retry(**retry),  # type: ignore[arg-type]
        transport=httpx.MockTransport(handler),
    )


def test_429_waits_what_retry_after_says(sleeps: list[float]) -> None:
    handler, seen = scripted(
        httpx.Response(429, headers={"Retry-After": "2"}, json={"title": "Too Many Requests"}),
        httpx.Response(200, json=ANSWER),
    )
    answer = make(handler).query("Capital of France?", mode="vector", k=3)
    assert answer.answer == "Paris"
    assert sleeps == [2.0]
    assert len(seen) == 2
    assert seen[0].headers["Authorization"] == "Bearer kgs_test"
    assert json.loads(seen[0].content) == {
        "question": "Capital of France?",
        "mode": "vector",
        "k": 3,
        "explain": True,
    }


def test_503_with_an_http_date_and_the_cap(sleeps: list[float]) -> None:
    later = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    handler, _ = scripted(
        httpx.Response(503, headers={"Retry-After": later}),
        httpx.Response(200, json={"status": "ok"}),
    )
    assert make(handler, max_wait_s=10).status() == {"status": "ok"}
    assert sleeps == [10.0]  # 120 s asked, capped


def test_backoff_without_the_header_then_the_last_answer_is_raised(sleeps: list[float]) -> None:
    problem = {"title": "Service Unavailable", "detail": "the broker did not answer"}
    handler, seen = scripted(*[httpx.Response(503, json=problem)] * 3)
    with pytest.raises(ApiError) as refused:
        make(handler, attempts=3, base_s=1).status()
    assert len(seen) == 3
    assert len(sleeps) == 2
    assert 0.5 <= sleeps[0] <= 1.0
    assert 1.0 <= sleeps[1] <= 2.0
    assert refused.value.status == 503
    assert str(refused.value) == "503 Service Unavailable: the broker did not answer"


def test_a_refusal_is_raised_at_once_with_its_errors(sleeps: list[float]) -> None:
    problem = {"title": "Invalid document events", "detail": "1 invalid", "errors": [{"index": 0}]}
    handler, seen = scripted(httpx.Response(422, json=problem))
    with pytest.raises(ApiError) as refused:
        make(handler).ingest([{"doc_id": "d"}])
    assert (refused.value.status, refused.value.errors) == (422, [{"index": 0}])
    assert len(seen) == 1
    assert sleeps == []


def test_connection_failures_are_retried_and_the_same_events_resent(sleeps: list[float]) -> None:
    accepted = {"accepted": 1, "event_ids": ["x"], "topic": "kgstream.documents"}
    handler, seen = scripted(
        httpx.ConnectError("refused"),
        httpx.Response(503, headers={"Retry-After": "0"}),
        httpx.Response(202, json=accepted),
    )
    result = make(handler).ingest([{"doc_id": "d", "text": "Text."}])
    assert result.accepted == 1
    bodies = [json.loads(r.content) for r in seen]
    assert bodies[0] == bodies[1] == bodies[2]
    (event,) = bodies[0]
    assert event["event_id"].startswith("client-")
    assert (event["type"], event["doc_id"]) == ("upsert", "d")
    assert len(sleeps) == 2


def test_connection_failure_on_the_last_attempt_is_raised(sleeps: list[float]) -> None:
    handler, _ = scripted(httpx.ConnectError("refused"), httpx.ConnectError("refused"))
    with pytest.raises(httpx.ConnectError):
        make(handler, attempts=2).status()
    assert len(sleeps) == 1


def test_paths_and_ids_are_quoted(sleeps: list[float]) -> None:
    handler, seen = scripted(httpx.Response(404, json={"title": "Document not found"}))
    with pytest.raises(ApiError):
        make(handler).document("a/b c")
    assert seen[0].url.raw_path == b"/v1/documents/a%2Fb%20c"


async def test_the_async_client_retries_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr("services.client.asyncio.sleep", sleep)
    handler, seen = scripted(
        httpx.Response(429, headers={"Retry-After": "1"}), httpx.Response(200, json=ANSWER)
    )
    async with AsyncClient("http://api", transport=httpx.MockTransport(handler)) as kg:
        answer = await kg.query("Capital of France?")
    assert answer.mode_used == "vector"
    assert slept == [1.0]
    assert len(seen) == 2


def test_unusable_retry_after_values_fall_back_to_backoff(sleeps: list[float]) -> None:
    minus_zero = "Fri, 27 Nov 2026 05:00:00 -0000"  # parsed without a zone: taken as UTC
    handler, _ = scripted(
        httpx.Response(429, headers={"Retry-After": "NaN"}),
        httpx.Response(429, headers={"Retry-After": "soon"}),
        httpx.Response(429, headers={"Retry-After": minus_zero}),
        httpx.Response(200, json={"status": "ok"}),
    )
    assert make(handler, base_s=1, max_wait_s=1000).status() == {"status": "ok"}
    assert 0.5 <= sleeps[0] <= 1.0  # NaN: backoff
    assert 1.0 <= sleeps[1] <= 2.0  # not a date: backoff
    expected = (datetime(2026, 11, 27, 5, tzinfo=UTC) - datetime.now(UTC)).total_seconds()
    assert abs(sleeps[2] - min(max(expected, 0.0), 1000)) < 5


@pytest.mark.parametrize(
    ("doc_id", "path"), [(".", b"/v1/documents/%2E"), ("..", b"/v1/documents/%2E%2E")]
)
def test_dot_ids_stay_one_segment(sleeps: list[float], doc_id: str, path: bytes) -> None:
    handler, seen = scripted(httpx.Response(404, json={"title": "Document not found"}))
    with pytest.raises(ApiError):
        make(handler).document(doc_id)
    assert seen[0].url.raw_path == path


def test_a_read_timeout_is_not_retried(sleeps: list[float]) -> None:
    handler, seen = scripted(httpx.ReadTimeout("slow"))
    with pytest.raises(httpx.ReadTimeout):
        make(handler).query("Why?")
    assert (len(seen), sleeps) == (1, [])


def test_a_delete_is_retried_only_when_it_was_refused_unread(sleeps: list[float]) -> None:
    accepted = {"accepted": 1, "event_ids": ["d"], "topic": "kgstream.documents"}
    handler, seen = scripted(
        httpx.Response(429, headers={"Retry-After": "0"}),
        httpx.Response(503, json={"title": "Service unavailable"}),
        httpx.Response(202, json=accepted),
    )
    with pytest.raises(ApiError) as refused:
        make(handler).delete("doc-1")
    assert refused.value.status == 503  # maybe published: not sent again
    assert len(seen) == 2
    lost, seen_lost = scripted(httpx.ReadError("reset"))
    with pytest.raises(httpx.ReadError):
        make(lost).delete("doc-1")
    assert len(seen_lost) == 1


def test_a_lost_connection_is_retried_for_a_repeatable_call(sleeps: list[float]) -> None:
    handler, seen = scripted(httpx.ReadError("reset"), httpx.Response(200, json=ANSWER))
    assert make(handler).query("Capital of France?").answer == "Paris"
    assert len(seen) == 2
