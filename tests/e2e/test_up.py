"""`kgstream up` as a user runs it: it says where the API and the dashboard are, and Ctrl-C
(SIGINT to the whole foreground process group, workers included) stops everything with no
traceback. With KGSTREAM_LOG_FORMAT=json every log line of every process is one JSON object
(the user-facing messages on stdout stay text)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.core.infra.ports import free_port
from tests.support.cli import user_env

pytestmark = pytest.mark.e2e


def test_up_prints_its_addresses_and_stops_cleanly_on_ctrl_c(
    tmp_path: Path, user_home: Path
) -> None:
    port = free_port()
    env = user_env(user_home, api_port=str(port), log_level="INFO", log_format="json")
    out_path, err_path = tmp_path / "up.out", tmp_path / "up.err"
    with out_path.open("wb") as out_file, err_path.open("wb") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", "up"],
            env=env,
            cwd=tmp_path,
            stdout=out_file,
            stderr=err_file,
            start_new_session=True,  # its own process group, like a terminal's foreground job
        )
    try:
        deadline = time.monotonic() + 300
        while "Ctrl-C to stop" not in out_path.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, out_path.read_text() + err_path.read_text()
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out, err = out_path.read_text(), err_path.read_text()
    api = f"http://127.0.0.1:{port}"
    assert code == 0, out + err[-3000:]
    assert f"kgstream is up: query API on {api} (docs at {api}/docs)" in out
    assert f"dashboard: {api}/dashboard" in out
    assert out.rstrip().endswith("stopped")
    assert "Traceback" not in err, err[-3000:]
    records = [json.loads(line) for line in err.splitlines()]
    by_process = {r["process"] for r in records}
    assert by_process == {"cli", "indexer", "communities", "query-api"}, by_process
    loggers = {r["logger"].split(".")[0] for r in records}
    assert {"alembic", "faust", "uvicorn", "services"} <= loggers, loggers
