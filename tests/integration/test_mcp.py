"""The MCP server at /mcp of a real query API (uvicorn on a loopback port, KGSTREAM_AUTH=
required) on the real database and broker, driven by the official SDK's client: the tools it
lists, what they answer with a key, 401 without one, 403 for a tool outside the key's scopes
(over HTTP, as the MCP authorization spec asks, and from the tool itself, which is what
stdio relies on), and tenant binding on ingest."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from sqlalchemy import text

from services.core.api_keys import create_key, verify_key
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.manager import Endpoints
from services.core.infra.ports import free_port
from services.core.settings import Settings
from services.query_api.app import create_app
from services.query_api.auth import Principal
from services.query_api.mcp_server import TOOL_SCOPES, build_server
from services.retrieval.service import build_query_service
from tests.conftest import Infra
from tests.integration.test_query_llm_ingest import consume
from tests.support.mcp_client import mcp_client, payload, text_of
from tests.support.query_fixtures import clone_database
from tests.support.server import serving

pytestmark = pytest.mark.integration
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
TS_CLIENT = Path(__file__).resolve().parents[1] / "support" / "mcp_ts"  # package.json, lock


@dataclass(frozen=True)
class Stack:
    url: str  # the MCP endpoint
    database_url: str
    topic: str
    keys: dict[str, str]  # name -> plaintext
    source: str  # two related entities' names and a document of the sample
    target: str
    doc_id: str


@pytest.fixture(scope="module")
async def stack(
    community_db: str,
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> AsyncIterator[Stack]:
    url = clone_database(community_db, community_db.rsplit("/", 1)[1])
    topic = f"mcp-documents-{free_port()}"
    engine = make_engine(url)
    keys = {}
    for name, scopes, tenant in (
        ("reader", ["query"], None),
        ("writer", ["query", "ingest"], None),
        ("tenant", ["query", "ingest"], "t-mcp"),
        ("admin", ["admin"], None),
    ):
        keys[name] = (await create_key(engine, scopes, tenant=tenant, name=name))[1]
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT s.name AS source, t.name AS target, ev.doc_id FROM relationships r"
                    " JOIN entities s ON s.id = r.source_id JOIN entities t ON t.id = r.target_id"
                    " JOIN relationship_evidence ev ON ev.relationship_id = r.id"
                    " ORDER BY r.weight DESC, r.id LIMIT 1"
                )
            )
        ).one()
    await engine.dispose()
    settings = Settings(
        home=infra.home,
        database_url=url,
        kafka_bootstrap_servers=infra.bootstrap,
        documents_topic=topic,
        auth="required",
        read_wait_max_s=1.0,
    )
    # The server's engine is made here and first used on uvicorn's own loop.
    service = build_query_service(settings, make_engine(url), embedder, extractor, cpu_pool)
    app = create_app(settings, Endpoints(url, infra.bootstrap), service=service)
    with serving(app, free_port()) as base:
        yield Stack(f"{base}/mcp", url, topic, keys, row.source, row.target, str(row.doc_id))


@pytest.fixture(scope="module")
def raw() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as client:
        yield client


async def test_the_sdk_client_lists_and_runs_the_tools(stack: Stack, infra: Infra) -> None:
    async with mcp_client(stack.url, stack.keys["writer"]) as client:
        listed = (await client.list_tools()).tools
        assert {t.name for t in listed} == set(TOOL_SCOPES)
        for tool in listed:
            assert len(tool.description or "") > 60, tool.name
            assert tool.input_schema["type"] == "object"
        modes = {t.name: t for t in listed}["search"].input_schema["properties"]["mode"]
        assert set(modes["enum"]) == {"auto", "vector", "local", "global", "path", "graph"}

        found = payload(await client.call_tool("search", {"question": stack.source, "k": 3}))
        assert found["contexts"]
        assert len(found["contexts"]) <= 3
        assert all({"doc_id", "chunk_id", "text"} <= set(c) for c in found["contexts"])
        assert "answer" not in found
        question = f"What is the connection between {stack.source} and {stack.target}?"
        answered = payload(await client.call_tool("answer", {"question": question}))
        assert answered["answer"]
        assert answered["mode_used"] in ("path", "local")

        paths = payload(
            await client.call_tool("find_paths", {"source": stack.source, "target": stack.target})
        )
        assert paths["source"]["name"] == stack.source
        assert paths["paths"]
        route = paths["paths"][0]["entities"]  # in path order (hops as stored)
        assert (route[0], route[-1]) == (stack.source, stack.target)

        entity = payload(await client.call_tool("get_entity", {"entity": stack.source}))
        assert entity["name"] == stack.source
        assert entity["neighbours"]
        communities = payload(await client.call_tool("list_communities", {"limit": 5}))
        assert communities["snapshot_id"]
        assert communities["communities"]

        document = payload(await client.call_tool("get_document", {"doc_id": stack.doc_id}))
        assert document["doc_id"] == stack.doc_id
        assert document["chunks"] >= 1
        indexed = f"{document['title']}\n\n{document['text']}"  # the title leads chunk 1
        by_title = payload(
            await client.call_tool("search", {"question": document["title"], "mode": "vector"})
        )
        passages = [c["text"] for c in by_title["contexts"] if c["doc_id"] == stack.doc_id]
        assert passages
        assert all(passage in indexed for passage in passages)
        assert document["tenant"] is None
        assert document["acl"] is None

        doc = {"doc_id": "mcp-doc-1", "title": "MCP", "text": "Ada Lovelace wrote notes."}
        accepted = payload(await client.call_tool("ingest_documents", {"documents": [doc]}))
        deleted = payload(await client.call_tool("delete_document", {"doc_id": "mcp-doc-1"}))
    events = [json.loads(m.value) for m in consume(infra.bootstrap, stack.topic, expected=2)]
    assert [e["event_id"] for e in events] == accepted["event_ids"] + deleted["event_ids"]
    assert events[0]["type"] == "upsert"
    assert events[0]["text"] == doc["text"]
    assert events[0]["event_id"].startswith("mcp-")
    assert events[0]["occurred_at"]
    assert events[1] == {**events[1], "type": "delete", "doc_id": "mcp-doc-1"}


async def test_errors_are_tool_errors_that_say_what_went_wrong(stack: Stack) -> None:
    async with mcp_client(stack.url, stack.keys["writer"]) as client:
        missing = await client.call_tool("get_document", {"doc_id": "no-such-document"})
        assert missing.is_error
        assert "404 Document not found" in text_of(missing)
        bad = await client.call_tool("ingest_documents", {"documents": [{"doc_id": "x"}]})
        assert bad.is_error
        assert "422 Invalid document events" in text_of(bad)
        assert "text" in text_of(bad)  # the contract's reason: an upsert needs its text
        nowhere = await client.call_tool(
            "find_paths", {"source": "Zzyzx Qwerty", "target": stack.target}
        )
        assert nowhere.is_error
        assert "404 Entity not found" in text_of(nowhere)


async def test_find_facts_reads_what_held_when(stack: Stack) -> None:
    async with mcp_client(stack.url, stack.keys["reader"]) as client:
        # The sample names years: facts that held since 1000 are the ones that state a time.
        dated = payload(await client.call_tool("find_facts", {"from_date": "1000-01-01"}))
        assert dated["facts"]
        assert all(f["valid_from"] or f["valid_to"] for f in dated["facts"])
        first = next(f for f in dated["facts"] if f["valid_from"] and f["entities"])
        day = first["valid_from"]  # its first day
        window = {"entity": first["entities"][0]["name"], "from_date": day, "to_date": day}
        mine = payload(await client.call_tool("find_facts", window))
        assert first["sentence"] in [f["sentence"] for f in mine["facts"]]
        both = await client.call_tool("find_facts", {"at": "1990-01-01", "from_date": "1980-01-01"})
        assert both.is_error
        assert "422 Invalid request" in text_of(both)


async def test_search_reads_the_documents_as_they_were(stack: Stack) -> None:
    async with mcp_client(stack.url, stack.keys["reader"]) as client:
        now = payload(
            await client.call_tool(
                "search", {"question": "Irwin Shaw", "as_of": "2030-01-01T00:00:00Z"}
            )
        )
        before = payload(
            await client.call_tool(
                "search", {"question": "Irwin Shaw", "as_of": "2023-12-31T00:00:00+01:00"}
            )
        )
        graph = await client.call_tool(
            "answer", {"question": "Irwin Shaw", "mode": "local", "as_of": "2030-01-01T00:00:00Z"}
        )
    # The sample's documents occurred on 2024-01-01: after a later time as they are, before
    # it not yet there.
    assert now["mode_used"] == "vector"
    assert "Irwin Shaw" in [c["title"] for c in now["contexts"]]
    assert before["contexts"] == []
    assert graph.is_error
    assert "422 Invalid request" in text_of(graph)
    assert "as_of answers from passages" in text_of(graph)


async def test_arguments_are_checked_as_the_routes_check_them(stack: Stack) -> None:
    async with mcp_client(stack.url, stack.keys["writer"]) as client:
        for tool, arguments in (
            ("delete_document", {"doc_id": "a\nb"}),
            ("get_document", {"doc_id": "x" * 513}),
            ("get_entity", {"entity": "a\x00b"}),
            ("find_paths", {"source": "x" * 201, "target": "y"}),
        ):
            refused = await client.call_tool(tool, arguments)
            assert refused.is_error, (tool, arguments)
            assert "validation error" in text_of(refused).lower(), text_of(refused)


async def test_a_read_that_cannot_catch_up_is_409(stack: Stack) -> None:
    async with mcp_client(stack.url, stack.keys["reader"]) as client:
        late = await client.call_tool(
            "search", {"question": "Leland", "after_event": "never-published"}
        )
    assert late.is_error
    assert "409 Not caught up" in text_of(late)
    assert "(retry in a moment)" in text_of(late)


def test_without_a_key_401_with_a_challenge(stack: Stack, raw: httpx.Client) -> None:
    resp = raw.post(stack.url, json=INITIALIZE, headers=HEADERS)
    assert resp.status_code == 401
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    bad = raw.post(stack.url, json=INITIALIZE, headers={**HEADERS, "Authorization": "Bearer x"})
    assert bad.status_code == 401
    assert 'error="invalid_token"' in bad.headers["WWW-Authenticate"]


def test_only_post_is_served(stack: Stack, raw: httpx.Client) -> None:
    """Stateless: no event stream to GET (it would hold an admission slot for nothing) and
    no session to DELETE, with a key or without."""
    stream = {"Accept": "text/event-stream"}
    keyed = {**stream, "Authorization": f"Bearer {stack.keys['reader']}"}
    for headers in (stream, keyed):
        assert raw.get(stack.url, headers=headers).status_code == 405
    assert raw.delete(stack.url, headers=keyed).status_code == 405
    assert raw.delete(stack.url, headers=stream).status_code == 401  # admission asks first


async def test_the_sdk_client_fails_without_a_key(stack: Stack) -> None:
    # The SDK reports an HTTP error status as an MCPError without the status (the raw tests
    # above see the 401 and 403 themselves).
    with pytest.raises(BaseException) as failure:  # noqa: PT011 - an ExceptionGroup of it
        async with mcp_client(stack.url) as client:
            await client.list_tools()
    assert "Server returned an error response" in repr(failure.value)


@pytest.mark.parametrize(
    ("key", "tool", "scope"),
    [("reader", "ingest_documents", "ingest"), ("writer", "status", "admin")],
)
def test_a_tool_outside_the_keys_scopes_is_403(
    stack: Stack, raw: httpx.Client, key: str, tool: str, scope: str
) -> None:
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {}},
    }
    headers = {**HEADERS, "Authorization": f"Bearer {stack.keys[key]}"}
    resp = raw.post(stack.url, json=call, headers=headers)
    assert resp.status_code == 403, resp.text
    assert f'error="insufficient_scope", scope="{scope}"' in resp.headers["WWW-Authenticate"]
    assert f"lacks the {scope!r} scope" in resp.json()["detail"]


async def test_the_sdk_client_sees_the_403(stack: Stack) -> None:
    async with mcp_client(stack.url, stack.keys["reader"]) as client:
        assert payload(await client.call_tool("search", {"question": "Leland", "k": 1}))
        with pytest.raises(MCPError, match="Server returned an error response"):
            await client.call_tool("delete_document", {"doc_id": stack.doc_id})


async def test_admin_status(stack: Stack) -> None:
    async with mcp_client(stack.url, stack.keys["admin"]) as client:
        status = payload(await client.call_tool("status", {}))
    engine = make_engine(stack.database_url)
    async with engine.connect() as conn:
        documents = await conn.scalar(text("SELECT count(*) FROM documents WHERE NOT deleted"))
    await engine.dispose()
    assert status["documents"] == documents > 0
    assert status["snapshot"]
    assert "replicas" in status


async def test_tools_refuse_by_scope_without_http(stack: Stack) -> None:
    """stdio has no HTTP to refuse with: the tool itself refuses (an MCP tool error)."""
    engine = make_engine(stack.database_url)
    try:
        key = await verify_key(engine, stack.keys["reader"])
    finally:
        await engine.dispose()
    assert key is not None
    server = build_server(ops=None, principal_of=lambda _ctx: Principal(key.caller(), key))  # type: ignore[arg-type]
    async with Client(server) as client:
        refused = await client.call_tool("ingest_documents", {"documents": [{"doc_id": "a"}]})
    assert refused.is_error
    assert "403 Forbidden: this API key lacks the 'ingest' scope" in text_of(refused)


async def test_tenant_keys_write_only_their_tenant(stack: Stack) -> None:
    async with mcp_client(stack.url, stack.keys["tenant"]) as client:
        other = {"doc_id": "x-1", "text": "Text.", "tenant": "someone-else"}
        refused = await client.call_tool("ingest_documents", {"documents": [other]})
        assert refused.is_error
        assert "403 Forbidden" in text_of(refused)
        # the sample's documents have no tenant: not this key's to delete, nor to read
        gone = await client.call_tool("delete_document", {"doc_id": stack.doc_id})
        assert gone.is_error
        assert "404 Document not found" in text_of(gone)
        unseen = await client.call_tool("get_document", {"doc_id": stack.doc_id})
        assert unseen.is_error
        assert "404" in text_of(unseen)
        found = payload(await client.call_tool("search", {"question": stack.source}))
        assert found["contexts"] == []


@pytest.fixture(scope="module")
def node_client() -> list[str]:
    """The TypeScript SDK's client (tests/support/mcp_ts, its lock file pinned), installed
    with `npm ci` on first use; skipped, saying why, where node or npm cannot do it."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        pytest.skip(
            "node is not installed (Debian: nodejs, npm): the TypeScript SDK check needs it"
        )
    if not (TS_CLIENT / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        if npm is None:
            pytest.skip("npm is not installed: cannot install the TypeScript MCP SDK")
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=TS_CLIENT,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"npm ci could not install the TypeScript MCP SDK: {done.stderr[-500:]}")
    return [node, str(TS_CLIENT / "client.mjs")]


def test_the_typescript_sdk_client_talks_to_it(stack: Stack, node_client: list[str]) -> None:
    """The TypeScript SDK (1.x, what most desktop agents embed) over streamable HTTP."""
    done = subprocess.run(
        [*node_client, stack.url, stack.keys["reader"], stack.source],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tools"] == sorted(TOOL_SCOPES)
    assert result["isError"] is False
    assert result["structured"]["contexts"]
    assert {"doc_id", "chunk_id", "text"} <= set(result["structured"]["contexts"][0])


async def test_graph_query_counts_and_lists_with_evidence(stack: Stack) -> None:
    async with mcp_client(stack.url, stack.keys["reader"]) as client:
        plan = {
            "start": {"names": [stack.target]},
            "follow": [{"direction": "both"}],
            "result": {"op": "list", "limit": 200},
        }
        listed = payload(await client.call_tool("graph_query", {"plan": plan}))
        assert listed["count"] == len(listed["rows"]) > 0
        assert [r["name"] for r in listed["started_from"]] == [stack.target]
        assert all(r["hops"] == 1 and r["evidence"] for r in listed["rows"])
        counted = {**plan, "result": {"op": "count"}}
        assert (
            payload(await client.call_tool("graph_query", {"plan": counted}))["count"]
            == (listed["count"])
        )
        bad = await client.call_tool(
            "graph_query", {"plan": {"start": {}, "result": {"op": "count"}}}
        )
        assert bad.is_error
        assert "start needs names or types" in text_of(bad)
