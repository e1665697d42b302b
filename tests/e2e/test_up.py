"""`kgstream up` as a user runs it: it says where the API and the dashboard are, and Ctrl-C
(SIGINT to the whole foreground process group, workers included) stops everything with no
traceback. With KGSTREAM_LOG_FORMAT=json every log line of every process is one JSON object
(the user-facing messages on stdout stay text)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from services.core.infra.ports import free_port
from tests.support.cli import kgstream_up, user_env

pytestmark = pytest.mark.e2e


def test_up_prints_its_addresses_and_stops_cleanly_on_ctrl_c(
    tmp_path: Path, user_home: Path
) -> None:
    port = free_port()
    # Any free metrics ports: other tests may hold the defaults.
    ports = {"indexer_metrics_port": "0", "communities_metrics_port": "0"}
    env = user_env(user_home, api_port=str(port), log_level="INFO", log_format="json", **ports)
    with kgstream_up(env, tmp_path) as up:
        os.killpg(up.proc.pid, signal.SIGINT)
        code = up.proc.wait(timeout=120)
    out, err = up.out.read_text(), up.err.read_text()
    api = f"http://127.0.0.1:{port}"
    assert code == 0, out + err[-3000:]
    assert f"kgstream is up: query API on {api} (docs at {api}/docs)" in out
    assert f"dashboard: {api}/dashboard" in out
    assert f"graph explorer: {api}/explorer" in out
    assert f"MCP for agents: {api}/mcp" in out
    assert out.rstrip().endswith("stopped")
    assert "Traceback" not in err, err[-3000:]
    records = [json.loads(line) for line in err.splitlines()]
    by_process = {r["process"] for r in records}
    assert by_process == {"cli", "indexer", "communities", "query-api"}, by_process
    loggers = {r["logger"].split(".")[0] for r in records}
    # alembic's own lines are at DEBUG: the migrations say one line of their own
    assert {"faust", "uvicorn", "services"} <= loggers, loggers
    assert any(r["message"].startswith("database schema (empty) -> ") for r in records)
