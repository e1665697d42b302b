"""The official MCP SDK's client against kgstream: over real HTTP (a URL), over an app in
process (httpx2's ASGI transport; the SDK's own HTTP client library), or over stdio."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from services.query_api.mcp_server import running

LOCAL = "http://127.0.0.1:8000"  # a Host the loopback API's DNS rebinding guard admits


@asynccontextmanager
async def mcp_client(url: str, key: str | None = None, *, app: Any = None) -> AsyncIterator[Client]:
    """An initialised MCP client session; ``app``: an ASGI app to call in process."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    transport = httpx2.ASGITransport(app=app) if app is not None else None
    async with (
        httpx2.AsyncClient(headers=headers, transport=transport, timeout=120) as http,
        Client(streamable_http_client(url, http_client=http), raise_exceptions=True) as client,
    ):
        yield client


def payload(result: CallToolResult) -> dict[str, Any]:
    """A successful tool call's structured result (failing with its message otherwise)."""
    assert not result.is_error, text_of(result)
    if result.structured_content is not None:
        return dict(result.structured_content)
    found: dict[str, Any] = json.loads(text_of(result))
    return found


def text_of(result: CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


@asynccontextmanager
async def sessions_running(server: Any) -> AsyncIterator[None]:
    """The MCP server's session manager running, as the API's lifespan runs it, for an app
    called in process (no lifespan runs there). Entered and left in one task of its own:
    pytest-asyncio sets a fixture up and tears it down in different tasks, and anyio's task
    group must be left where it was entered."""
    started, stop = asyncio.Event(), asyncio.Event()

    async def run() -> None:
        async with running(server):
            started.set()
            await stop.wait()

    task = asyncio.create_task(run(), name="mcp-sessions")
    await started.wait()
    try:
        yield
    finally:
        stop.set()
        await task
