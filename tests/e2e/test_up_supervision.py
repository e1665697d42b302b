"""`kgstream up` supervises its workers (issue 18, finding 2): SIGKILL the communities worker
and the query API of a running `up`; each is started again, /readyz answers 200 again, the
embedded PostgreSQL and broker keep their pids the whole time, and documents published before
and after the kills become queryable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from services.core.infra.ports import free_port, pid_alive
from tests.support.cli import kgstream_up, user_env

pytestmark = pytest.mark.e2e


def workers(up_pid: int) -> dict[str, int]:
    """The `kgstream worker NAME` children of the `up` process, by name."""
    children = Path(f"/proc/{up_pid}/task/{up_pid}/children").read_text().split()
    found = {}
    for pid in map(int, children):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "worker" in argv and pid_alive(pid):
            found[argv[argv.index("worker") + 1]] = pid
    return found


def infra_pids(home: Path) -> dict[str, int]:
    state = json.loads((home / "infra.json").read_text())
    return {name: int(state[name]["pid"]) for name in ("postgres", "broker")}


def publish(tmp_path: Path, env: dict[str, str], doc_id: str, text: str) -> None:
    event = {"event_id": f"{doc_id}@1", "type": "upsert", "doc_id": doc_id, "title": doc_id}
    event["occurred_at"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    path = tmp_path / f"{doc_id}.jsonl"
    path.write_text(json.dumps({**event, "text": text}) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "publish", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def found_by_query(api: str, text: str) -> set[str]:
    body = {"question": text, "mode": "vector", "k": 3}
    try:
        resp = httpx.post(f"{api}/v1/query", json=body, timeout=30)
    except httpx.HTTPError:
        return set()
    if resp.status_code != 200:
        return set()
    return {ctx["doc_id"] for ctx in resp.json()["contexts"]}


def ready(api: str) -> bool:
    try:
        return httpx.get(f"{api}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_up_restarts_a_killed_worker_and_keeps_its_infrastructure(
    tmp_path: Path, user_home: Path
) -> None:
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    env = user_env(
        user_home, api_port=str(port), indexer_metrics_port="0", communities_metrics_port="0"
    )
    docs = {
        "before-kill": "Quillanporth is a lighthouse keeper who paints moths on driftwood.",
        "after-kill": "Vennebrusk is a glassblower who tunes bells in a flooded quarry.",
    }
    with kgstream_up(env, tmp_path) as up:
        proc = up.proc
        infra = infra_pids(user_home)
        killed = workers(proc.pid)
        assert set(killed) == {"indexer", "communities", "query-api"}, killed

        publish(tmp_path, env, "before-kill", docs["before-kill"])
        os.kill(killed["communities"], signal.SIGKILL)
        os.kill(killed["query-api"], signal.SIGKILL)
        publish(tmp_path, env, "after-kill", docs["after-kill"])

        deadline = time.monotonic() + 180
        found: dict[str, set[str]] = {}
        while time.monotonic() < deadline:
            assert proc.poll() is None, up.log()
            assert all(pid_alive(pid) for pid in infra.values()), infra
            now = workers(proc.pid)
            restarted = all(now.get(n, pid) != pid for n, pid in killed.items() if n != "indexer")
            if restarted and ready(api):
                found = {doc: found_by_query(api, text) for doc, text in docs.items()}
                if all(doc in hits for doc, hits in found.items()):
                    break
            time.sleep(1)
        else:
            pytest.fail(f"not recovered in time: workers {workers(proc.pid)}, {found}\n{up.log()}")
        assert now["indexer"] == killed["indexer"]
        assert infra_pids(user_home) == infra
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=120)
    err = up.err.read_text()
    assert code == 0, up.log()
    for name in ("communities", "query-api"):
        assert f"the {name} process exited with code -9: restarting it in" in err, err[-3000:]
    assert not any(pid_alive(pid) for pid in infra.values())  # Ctrl-C still stops everything
