"""`kgstream mcp`: kgstream's MCP tools for a desktop agent, over stdio. The agent starts this
command; it reads the database and publishes to the broker of the stack `kgstream up` runs
(or of KGSTREAM_DATABASE_URL and KGSTREAM_KAFKA_BOOTSTRAP_SERVERS), as the caller of
KGSTREAM_API_KEY when that is set (its scopes, tenant and groups, checked once at start), else
as the operator, like every other command of this CLI."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import TYPE_CHECKING

from services.cli.common import fail
from services.cli.common import settings as _settings
from services.core.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from services.query_api.auth import Principal


def mcp() -> None:
    """Serve kgstream's tools to an agent over stdio (the Model Context Protocol).

    Point a desktop agent's MCP configuration at this command (docs/integration.md). It
    reads the stack that `kgstream up` runs; with KGSTREAM_API_KEY set it answers as that
    key's caller, otherwise as the operator. Logs go to stderr: stdout carries the protocol.
    """
    from services.core.errors import KgstreamError

    settings = _settings("mcp")
    try:
        asyncio.run(_serve(settings))
    except KgstreamError as exc:
        raise fail(str(exc)) from exc


async def _serve(settings: Settings) -> None:
    from services.core.db.engine import check_schema
    from services.core.infra.manager import resolve_endpoints
    from services.query_api.ingest import DocumentPublisher
    from services.query_api.mcp_server import build_server
    from services.query_api.operations import Operations
    from services.retrieval.compose import build_service

    endpoints = resolve_endpoints(settings)
    with contextlib.redirect_stdout(sys.stderr):  # nothing but the protocol on stdout
        service = build_service(settings, endpoints.database_url)
    publisher = DocumentPublisher(
        endpoints.kafka_bootstrap_servers, settings.documents_topic, settings
    )
    try:
        await check_schema(service.engine, settings.embedding_dim)
        principal = await _principal(settings, service.engine)
        ops = Operations(service, publisher, settings)
        await build_server(ops, lambda _ctx: principal).run_stdio_async()
    finally:
        await asyncio.to_thread(publisher.close)
        await service.engine.dispose()


async def _principal(settings: Settings, engine: AsyncEngine) -> Principal:
    """The key's principal, or the operator's without a key."""
    from services.core.access import Caller
    from services.core.api_keys import verify_key
    from services.core.errors import ConfigurationError
    from services.query_api.auth import Principal

    if settings.api_key is None:
        return Principal(Caller.operator(), None)
    key = await verify_key(engine, settings.api_key.get_secret_value())
    if key is None:
        raise ConfigurationError("KGSTREAM_API_KEY is malformed, unknown or revoked")
    return Principal(key.caller(), key)
