"""An agent on the embedded default, as a user sets it up: `kgstream up` with keys required,
a key from `kgstream keys create`, and the official MCP SDK's client, first over HTTP at /mcp
(it writes documents, reads its own write with after_event, answers, finds a path), then
through `kgstream mcp` over stdio, as a desktop agent starts it (with the key, and as the
operator without one)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from services.core.infra.ports import free_port
from tests.support.cli import ROOT, kgstream_up, user_env
from tests.support.mcp_client import mcp_client, payload, text_of

pytestmark = pytest.mark.e2e
DOCUMENTS = [
    {
        "doc_id": "agent-lovelace",
        "title": "Ada Lovelace",
        "text": "Ada Lovelace worked with Charles Babbage in London on his engine.",
    },
    {
        "doc_id": "agent-babbage",
        "title": "Charles Babbage",
        "text": "Charles Babbage was a professor at Cambridge for eleven years.",
    },
]


def _kgstream(env: dict[str, str], *args: str) -> str:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


async def test_an_agent_over_http_and_stdio(tmp_path: Path, user_home: Path) -> None:
    port = free_port()
    ports = {"indexer_metrics_port": "0", "communities_metrics_port": "0"}
    # The after_event search waits for publish, indexing and write, which on a loaded machine
    # can take well past the default 3 s; the request budget above it, both under the MCP
    # client's 120 s so a slow pipeline is answered 409, not cut off.
    waits = {"read_wait_max_s": "90", "query_timeout_s": "110"}
    env = user_env(user_home, api_port=str(port), auth="required", **ports, **waits)
    with kgstream_up(env, tmp_path) as up:
        key = _kgstream(env, "keys", "create", "--scopes", "query,ingest").splitlines()[-1]
        async with mcp_client(f"http://127.0.0.1:{port}/mcp", key) as client:
            accepted = payload(await client.call_tool("ingest_documents", {"documents": DOCUMENTS}))
            last = accepted["event_ids"][-1]
            found = payload(
                await client.call_tool(
                    "search",
                    {"question": "Where was Charles Babbage a professor?", "after_event": last},
                )
            )
            # indexed by the time the search reads (read your own write)
            assert "agent-babbage" in {c["doc_id"] for c in found["contexts"]}, found
            answered = payload(
                await client.call_tool(
                    "answer", {"question": "Who did Ada Lovelace work with?", "mode": "vector"}
                )
            )
            assert "Charles Babbage" in answered["answer"] + answered["support"], answered
            paths = payload(
                await client.call_tool(
                    "find_paths", {"source": "Ada Lovelace", "target": "Cambridge"}
                )
            )
            # the route's entities in path order (a hop is written as its relationship is
            # stored, which may run against the path)
            route = paths["paths"][0]
            assert route["entities"] == ["Ada Lovelace", "Charles Babbage", "Cambridge"], paths
            assert len(route["hops"]) == 2

        command = [sys.executable, "-m", "services.cli.main", "mcp"]
        keyed = StdioServerParameters(
            command=command[0], args=command[1:], env={**env, "KGSTREAM_API_KEY": key}, cwd=ROOT
        )
        async with Client(keyed) as desktop:
            assert len((await desktop.list_tools()).tools) == 11
            doc = payload(await desktop.call_tool("get_document", {"doc_id": "agent-lovelace"}))
            assert doc["text"] == DOCUMENTS[0]["text"]
            refused = await desktop.call_tool("status", {})
            assert refused.is_error
            assert "403 Forbidden" in text_of(refused)
        operator = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=ROOT)
        async with Client(operator) as desktop:
            status = payload(await desktop.call_tool("status", {}))
            assert status["documents"] == 2
        assert up.proc.poll() is None, up.log()
