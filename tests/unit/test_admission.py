"""Admission (services/query_api/limits.py) holds no place while it waits for a client: not for
a body the client is slow to send, nor for a response the client is slow to read, whether the
app's own or a refusal of admission's (401, 504) (issue 30, finding 3)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from services.core.access import Caller
from services.query_api.auth import Principal, Unauthorized
from services.query_api.limits import Admission


async def authenticate(authorization: str | None) -> Principal:
    if authorization == "Bearer bad":
        raise Unauthorized("the API key is malformed, unknown or revoked", invalid=True)
    return Principal(Caller(), None)


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if (await receive())["body"] == b"hang":
        await asyncio.Event().wait()  # past any time budget
    await JSONResponse({"ok": True})(scope, receive, send)


def admission(timeout_s: float) -> Admission:
    return Admission(
        app,
        exempt=(),
        authenticate=authenticate,
        max_concurrent=1,
        per_key=1,
        timeout_s=timeout_s,
        body_timeout_s=60,
        max_waiting_bodies=4,
    )


def scope(authorization: str | None = None) -> Scope:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
    if authorization is not None:
        headers.append((b"authorization", authorization.encode()))
    return {"type": "http", "method": "POST", "path": "/v1/query", "headers": headers}


def body(content: bytes | None = b"{}") -> Receive:
    """The request's body (None: it never comes)."""

    async def receive() -> Message:
        if content is None:
            await asyncio.Event().wait()
        return {"type": "http.request", "body": content, "more_body": False}

    return receive


async def waiting_for(
    run: Callable[[Send], Coroutine[Any, Any, None]], *, reads: bool
) -> tuple[asyncio.Task[None], list[Message]]:
    """Runs a request whose client reads its response (or never does); returns once it waits
    for the client (with what was sent to it)."""
    sent: list[Message] = []
    never = asyncio.Event()

    async def send(message: Message) -> None:
        sent.append(message)
        if not reads:
            await never.wait()

    task = asyncio.create_task(run(send))
    for _ in range(100):  # a few turns of the loop: nothing here waits for time
        await asyncio.sleep(0)
    return task, sent


@pytest.mark.parametrize(
    ("authorization", "content", "status"),
    [
        (None, b"{}", 200),  # the app's response, unread
        ("Bearer bad", b"{}", 401),  # the key check's refusal, unread
        (None, b"hang", 504),  # the time budget's refusal, unread
        (None, None, None),  # a body that does not come
    ],
)
async def test_no_place_is_held_while_the_client_is_awaited(
    authorization: str | None, content: bytes | None, status: int | None
) -> None:
    gate = admission(timeout_s=1e-6 if content == b"hang" else 60)
    request = scope(authorization)
    task, sent = await waiting_for(lambda send: gate(request, body(content), send), reads=False)
    try:
        assert not task.done()
        assert [m.get("status") for m in sent] == ([status] if status else [])
        assert gate.in_flight == 0, "a place is held while the client is awaited"
        # and the one place serves another caller meanwhile
        gate.timeout_s = 60
        other, answer = await waiting_for(lambda send: gate(scope(), body(), send), reads=True)
        assert other.done()
        assert answer[0]["status"] == 200
    finally:
        task.cancel()
