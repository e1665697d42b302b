"""Admission control is counted per authenticated key and cannot be held without one (issue 18,
review of finding 12): the spellings auth accepts for one key share its allowance, requests with
no usable key are 401 before they take a place, a body that never arrives is 408, and keyless
loopback callers may use every place. Nor can it be held by sending nothing (issue 30, finding
3): a request takes a place only with its whole body in, and the requests waiting for their
bodies give way to newcomers, the one idle longest first."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.core.api_keys import create_key
from services.core.db.engine import make_engine
from tests.integration.test_api_limits import (
    HOLD_S,
    AppFactory,
    ServeApi,
    assert_problem,
    bearer,
    holding,
    make_client,
    serve_api,
)
from tests.support.faults import wait_until

__all__ = ["make_client", "serve_api"]  # the fixtures, used here by name
pytestmark = pytest.mark.integration
QUERY = {"question": "Leland", "mode": "vector"}


async def new_key(database_url: str, scopes: list[str]) -> str:
    engine = make_engine(database_url)
    try:
        return (await create_key(engine, scopes))[1]
    finally:
        await engine.dispose()


async def test_every_spelling_of_a_key_shares_its_allowance(
    make_client: AppFactory, sample_db: str
) -> None:
    """Failed before: the share was keyed on the raw header, so `bearer K` and `BEARER  K `
    (the same key to auth) were other keys and one key could take every place."""
    key = await new_key(sample_db, ["query", "ingest"])
    client, _ = await make_client(query_max_concurrent=8, query_max_concurrent_per_key=2)
    release, tasks = await holding(client, 2, bearer(key))
    try:
        for spelling in (f"bearer {key}", f"BEARER  {key} ", f" Bearer {key}"):
            resp = await client.post("/v1/query", json=QUERY, headers={"Authorization": spelling})
            assert "KGSTREAM_QUERY_MAX_CONCURRENT_PER_KEY" in assert_problem(resp, 429)["detail"]
    finally:
        release.set()
        await asyncio.gather(*tasks)


async def test_no_usable_key_is_401_before_it_takes_a_place(
    make_client: AppFactory, sample_db: str
) -> None:
    """Failed before: admission ran before auth and the body was read before the key was
    checked, so stalled bodies with made-up keys held every place and an admin got 429."""
    admin = await new_key(sample_db, ["admin"])
    client, _ = await make_client(
        auth="required",
        query_max_concurrent=2,
        query_max_concurrent_per_key=1,
        api_body_timeout_s=HOLD_S,
    )
    made_up = [{}, {"Authorization": "Basic eDp5"}] + [bearer(f"kgs_made_{n}.up") for n in range(4)]
    release = asyncio.Event()
    try:
        tasks = [asyncio.create_task(stalled_query(client, release, h)) for h in made_up]
        # A bound for a broken run, below HOLD_S: a request that waits for its body ends only then.
        done, _ = await asyncio.wait(tasks, timeout=50)
        assert len(done) == len(tasks), "requests without a valid key still hold places"
        for task in tasks:
            resp = assert_problem(task.result(), 401)
            assert resp["title"] == "Unauthorized"
        assert task.result().headers["WWW-Authenticate"].startswith("Bearer")
        status = await client.get("/v1/status", headers=bearer(admin))
        assert status.status_code == 200, status.text[:300]
    finally:
        release.set()


async def stalled_query(
    client: httpx.AsyncClient, release: asyncio.Event, headers: dict[str, str]
) -> httpx.Response:
    """POST /v1/query whose body does not end before ``release``."""

    async def body() -> AsyncIterator[bytes]:
        yield b'{"question": '
        await release.wait()
        yield b'"Leland"}'

    headers = {"content-type": "application/json", **headers}
    return await client.post("/v1/query", content=body(), headers=headers)


async def test_a_body_that_never_arrives_is_408_and_frees_its_place(
    make_client: AppFactory,
) -> None:
    """Failed before: a body that never arrived held its place for KGSTREAM_QUERY_TIMEOUT_S
    (30 s), then 504. (Since issue 30 it holds no place while it is awaited.)"""
    client, _ = await make_client(query_max_concurrent=1, api_body_timeout_s=0.5)
    never = asyncio.Event()
    resp = await asyncio.wait_for(stalled_query(client, never, {}), 60)  # a bound for a hang
    assert "KGSTREAM_API_BODY_TIMEOUT_S" in assert_problem(resp, 408)["detail"]
    assert (await client.post("/v1/query", json=QUERY)).status_code == 200  # the place is free


async def test_keyless_loopback_callers_may_use_every_place(make_client: AppFactory) -> None:
    """Failed before: requests without a key shared one per-key allowance, so the default
    `kgstream up` (loopback, no keys) served at most 8 of its 16 places at once."""
    client, _ = await make_client(query_max_concurrent=4, query_max_concurrent_per_key=2)
    release, tasks = await holding(client, 4)  # beyond the per-key share, all admitted
    try:
        full = await client.post("/v1/query", json=QUERY)
        assert "KGSTREAM_QUERY_MAX_CONCURRENT" in assert_problem(full, 429)["detail"]
    finally:
        release.set()
        await asyncio.gather(*tasks)


class Observer:
    """Wraps the app (``wrap``) to count the HTTP requests that have reached it and to see the
    sends that wait for a client to read (in the server's thread)."""

    def __init__(self) -> None:
        self.count = 0
        # Requests whose body the app has begun to read: past authentication (which holds a
        # place while it looks the key up), waiting for their bodies without one.
        self.reading = 0
        self.sending: dict[int, float] = {}  # a send in progress -> when it began

    def wrap(self, app: ASGIApp) -> ASGIApp:
        self.app = app
        return self

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.count += 1

        async def timed(message: Message) -> None:
            token = object()
            self.sending[id(token)] = time.monotonic()
            try:
                await send(message)
            finally:
                del self.sending[id(token)]

        first = True

        async def watched() -> Message:
            nonlocal first
            if first and scope["type"] == "http":
                first = False
                self.reading += 1
            return await receive()

        await self.app(scope, watched, timed)

    def stuck(self, n: int) -> bool:
        """Whether n sends have waited for their clients for over a second."""
        now = time.monotonic()
        return sum(now - began > 1 for began in list(self.sending.values())) >= n


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def idle_posts(
    url: str, arrivals: Observer, headers: list[dict[str, str]]
) -> list[Connection]:
    """One connection per ``headers`` that sends the headers of a POST /v1/query (announcing a
    body) and then nothing; returned once the app waits for all their bodies."""
    base = httpx.URL(url)
    connections = []
    for extra in headers:
        reader, writer = await asyncio.open_connection(base.host, base.port)
        lines = [
            "POST /v1/query HTTP/1.1",
            f"Host: {base.host}:{base.port}",
            "Content-Type: application/json",
            "Content-Length: 40",
            *(f"{name}: {value}" for name, value in extra.items()),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        connections.append((reader, writer))
    # Waiting for their bodies, not merely arrived: a request still being authenticated holds
    # a place for its key's lookup (a flake on a loaded machine: 16 lookups held every place
    # while the other key's ten queries were refused).
    arrived = await asyncio.to_thread(wait_until, lambda: arrivals.reading >= len(headers), 60)
    assert arrived, f"{arrivals.reading} of {len(headers)} requests wait for their bodies"
    return connections


async def queries(url: str, headers: dict[str, str], n: int = 10) -> list[int]:
    """The statuses of n queries sent one after the other."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return [
            (await client.post("/v1/query", json=QUERY, headers=headers)).status_code
            for _ in range(n)
        ]


async def test_callers_that_send_no_body_hold_no_place(serve_api: ServeApi, sample_db: str) -> None:
    """Finding 3 of issue 30: admission took the place before the body arrived, so sixteen
    connections from two keys (8 each, the per-key share of 16 places) that sent a POST's
    headers and no body held every place for the body timeout, and another key was 429 on all
    its requests. Now a request takes a place only once its body is in: the same sixteen wait
    (here for as long as they like) and the other key is served."""
    idlers = [await new_key(sample_db, ["query"]) for _ in range(2)]
    other = await new_key(sample_db, ["query"])
    arrivals = Observer()
    # default places (16, 8 per key); a body timeout longer than the test
    with serve_api(wrap=arrivals.wrap, api_body_timeout_s=HOLD_S) as url:
        idle = await idle_posts(url, arrivals, [bearer(k) for k in idlers for _ in range(8)])
        try:
            statuses = await queries(url, bearer(other))
        finally:
            for _, writer in idle:
                writer.close()
    assert statuses.count(200) == len(statuses), statuses


async def test_idle_senders_beyond_the_waiting_bound_give_way(
    serve_api: ServeApi, sample_db: str
) -> None:
    """Requests waiting for their bodies are bounded (KGSTREAM_API_MAX_WAITING_BODIES: the
    memory their bodies may take) without that bound becoming a place idle senders can hold:
    beyond it, a newcomer takes the place of the request idle longest (408). Twelve idle
    senders with room for four: eight give way at once, and another caller is still served."""
    idlers = [await new_key(sample_db, ["query"]) for _ in range(2)]
    other = await new_key(sample_db, ["query"])
    arrivals = Observer()
    settings = {"api_body_timeout_s": HOLD_S, "api_max_waiting_bodies": 4}
    with serve_api(wrap=arrivals.wrap, **settings) as url:
        idle = await idle_posts(url, arrivals, [bearer(k) for k in idlers for _ in range(6)])
        answers = [asyncio.create_task(reader.read()) for reader, _ in idle]  # to EOF
        try:
            statuses = await queries(url, bearer(other))
            assert await asyncio.to_thread(
                wait_until, lambda: sum(a.done() for a in answers) >= 8, 60
            ), sum(a.done() for a in answers)
            dropped = [a.result() for a in answers if a.done()]
        finally:
            for _, writer in idle:
                writer.close()
            await asyncio.gather(*answers, return_exceptions=True)
    assert statuses.count(200) == len(statuses), statuses
    assert len(dropped) >= 8, dropped
    for answer in dropped:
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:300]
        assert b"KGSTREAM_API_MAX_WAITING_BODIES" in answer, answer[:600]


async def unread_pipeline(url: str, path: str, n: int) -> socket.socket:
    """A connection that sends n GETs of ``path`` at once (pipelined) and reads nothing, with
    a small receive buffer; close the socket to hang up."""
    base = httpx.URL(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (base.host, base.port))
    request = f"GET {path} HTTP/1.1\r\nHost: {base.host}:{base.port}\r\n\r\n".encode()
    await loop.sock_sendall(sock, request * n)
    return sock


async def test_callers_that_read_no_response_hold_no_place(
    serve_api: ServeApi, sample_db: str
) -> None:
    """Failed before: a caller that pipelined requests on a connection and read nothing filled
    the server's send buffers, and the response that no longer fitted waited in the app's send
    holding its place for the whole time budget (KGSTREAM_QUERY_TIMEOUT_S): two such
    connections held both of two places and another key got 429. Now the place is given back
    once the response is made, before it is sent."""
    other = await new_key(sample_db, ["query"])
    observer = Observer()
    settings = {"query_max_concurrent": 2, "query_timeout_s": HOLD_S}
    with serve_api(wrap=observer.wrap, **settings) as url:
        # /openapi.json: 27 kB each, some 150 of them fill the buffers on loopback
        unread = [await unread_pipeline(url, "/openapi.json", 400) for _ in range(2)]
        try:
            stuck = await asyncio.to_thread(wait_until, lambda: observer.stuck(2), 60)
            assert stuck, f"{len(observer.sending)} sends wait, {observer.count} requests seen"
            statuses = await queries(url, bearer(other))
        finally:
            for sock in unread:
                sock.close()
    assert statuses.count(200) == len(statuses), statuses
