"""Issue 30's findings, reproduced by hand as the probe did, against a whole `kgstream up`.

    .venv/bin/python bench/repro_issue30.py [--home DIR] [--json]

Starts `kgstream up` with API keys required in a fresh home, then, each as a new operator
would: (1) a document shared with 200 groups, then good events of two tenants; (2) the broker
killed (`up` restarts it) and HTTP ingest tried again; (3) sixteen idle POSTs from two keys
while a third key queries; (4) one tenant's publisher alias and another tenant's memo naming
it; (5) `kgstream dlq replay` while the replayed records are dead-lettered again; (6) events
answered 202 while the indexer is paused, then the broker killed. Prints what each saw."""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg

from services.core.infra.manager import resolve_endpoints
from services.core.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
PORT = 8930


def cli(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kgstream {' '.join(args)}: {done.stdout}{done.stderr}")
    return done.stdout


def key(env: dict[str, str], scopes: str, tenant: str | None = None) -> str:
    args = ["keys", "create", "--scopes", scopes]
    if tenant:
        args += ["--tenant", tenant]
    return cli(env, *args).strip().splitlines()[-1].strip()


def wait(check: Callable[[], bool], timeout: float, poll: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return True
        time.sleep(poll)
    return False


def doc(doc_id: str, text: str, **extra: Any) -> dict[str, Any]:
    return {
        "event_id": f"{doc_id}-{uuid.uuid4().hex[:8]}",
        "type": "upsert",
        "doc_id": doc_id,
        "title": doc_id,
        "text": text,
        "occurred_at": "2026-11-27T00:00:00Z",
        **extra,
    }


class Stack:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KGSTREAM_")}
        self.env.update(
            PYTHONPATH=str(ROOT),
            KGSTREAM_HOME=str(home),
            KGSTREAM_AUTH="required",
            KGSTREAM_API_PORT=str(PORT),
            KGSTREAM_LOG_LEVEL="INFO",
        )
        self.url = f"http://127.0.0.1:{PORT}"
        self.up: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cli(self.env, "infra", "up")
        cli(self.env, "db", "upgrade")
        self.admin = key(self.env, "admin")
        self.t1 = key(self.env, "query,ingest", "t1")
        self.t2 = key(self.env, "query,ingest", "t2")
        self.other = key(self.env, "query,ingest", "t3")
        log = (self.home / "up.log").open("ab")
        self.up = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", "up"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
        ready = wait(lambda: httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200, 300)
        if not ready:
            raise RuntimeError("kgstream up did not become ready")

    def stop(self) -> None:
        if self.up is not None and self.up.poll() is None:
            self.up.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.up.wait(timeout=120)
        with contextlib.suppress(Exception):
            cli(self.env, "infra", "down", "--purge")

    def post(self, api_key: str, events: list[dict[str, Any]]) -> int:
        resp = httpx.post(
            f"{self.url}/v1/documents",
            json=events,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=30,
        )
        return resp.status_code

    def sql(self, statement: str) -> Any:
        endpoints = resolve_endpoints(Settings(home=self.home))
        url = endpoints.database_url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(url) as conn:
            row = conn.execute(statement).fetchone()
            return None if row is None else row[0]

    def applied(self, event_ids: list[str]) -> int:
        ids = ",".join("'" + e.replace("'", "''") + "'" for e in event_ids)
        return int(self.sql(f"SELECT count(*) FROM processed_events WHERE event_id IN ({ids})"))  # noqa: S608 - ids are ours

    def pid(self, name: str) -> int:
        return int(json.loads((self.home / "run" / f"{name}.json").read_text())["pid"])


def many_groups(stack: Stack) -> dict[str, Any]:
    groups = [base64.b64encode(hashlib.sha256(b"%d" % i).digest()).decode() for i in range(200)]
    wide = doc("wide-acl", "Grace Hopper wrote the memo in Arlington.", acl=groups)
    good1 = [doc(f"t1-{i}", f"Memo {i} about Ada Lovelace in London.") for i in range(20)]
    good2 = [doc(f"t2-{i}", f"Note {i} about Alan Turing in Manchester.") for i in range(8)]
    codes = [stack.post(stack.t1, [wide]), stack.post(stack.t1, good1), stack.post(stack.t2, good2)]
    ids = [e["event_id"] for e in [wide, *good1, *good2]]
    wait(lambda: stack.applied(ids) == len(ids), 180)
    return {"posted": codes, "applied": stack.applied(ids), "of": len(ids)}


def restart_broker(stack: Stack) -> None:
    """SIGKILL the embedded broker and start it again as an operator would (`kgstream infra
    up`: same port, topics created again)."""
    os.kill(stack.pid("broker"), signal.SIGKILL)
    time.sleep(1)
    cli(stack.env, "infra", "up")


def broker_restart(stack: Stack) -> dict[str, Any]:
    restart_broker(stack)
    accepted, tries = 0, 0
    deadline = time.monotonic() + 90
    while accepted < 5 and time.monotonic() < deadline:
        tries += 1
        with contextlib.suppress(httpx.HTTPError):
            if stack.post(stack.t1, [doc(f"after-restart-{accepted}", "Edsger Dijkstra.")]) == 202:
                accepted += 1
                continue
        time.sleep(1)
    ready = httpx.get(f"{stack.url}/readyz", timeout=5).json()
    return {"accepted": accepted, "tries": tries, "readyz_ingest": ready.get("ingest")}


def idle_posts(stack: Stack) -> dict[str, Any]:
    sockets = []
    for api_key in [stack.t1] * 8 + [stack.t2] * 8:
        s = socket.create_connection(("127.0.0.1", PORT))
        s.sendall(
            (
                "POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {api_key}\r\nContent-Length: 100\r\n\r\n"
            ).encode()
        )
        sockets.append(s)
    time.sleep(1)
    codes = []
    for _ in range(20):
        resp = httpx.post(
            f"{stack.url}/v1/query",
            json={"question": "Who wrote the memo?", "mode": "vector"},
            headers={"Authorization": f"Bearer {stack.other}"},
            timeout=30,
        )
        codes.append(resp.status_code)
    for s in sockets:
        s.close()
    return {"ok": codes.count(200), "refused_429": codes.count(429), "of": len(codes)}


def tenant_alias(stack: Stack) -> dict[str, Any]:
    facts = doc(
        "t2-helios",
        "Helios Dynamics builds turbines.",
        schema_version=2,
        entities=[{"name": "Helios Dynamics", "type": "ORG", "aliases": ["Kadalu Turbines"]}],
    )
    memo = doc("t1-kadalu", "Kadalu Turbines shipped the order to Pune.")
    codes = [stack.post(stack.t2, [facts])]
    wait(lambda: stack.applied([facts["event_id"]]) == 1, 120)
    codes.append(stack.post(stack.t1, [memo]))
    wait(lambda: stack.applied([memo["event_id"]]) == 1, 120)
    resolved = stack.sql(
        "SELECT e.name || ' / ' || coalesce(e.tenant, '-') FROM mentions m"
        " JOIN entities e ON e.id = m.entity_id"
        " WHERE m.doc_id = 't1-kadalu' AND m.surface = 'Kadalu Turbines' LIMIT 1"
    )
    seen = httpx.get(
        f"{stack.url}/v1/entities",
        params={"name": "Kadalu Turbines"},
        headers={"Authorization": f"Bearer {stack.t1}"},
        timeout=30,
    ).json()
    return {"posted": codes, "t1_mention_resolves_to": resolved, "t1_sees": seen}


def replay(stack: Stack) -> dict[str, Any]:
    bootstrap = json.loads((stack.home / "run" / "broker.json").read_text())["port"]
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{bootstrap}")
    for i in range(29):
        producer.send("kgstream.documents", key=b"bad-%d" % i, value=b"{not json %d" % i)
    producer.flush()
    producer.close()
    wait(lambda: int(stack.sql("SELECT count(*) FROM dead_letters")) >= 29, 120)
    letters = int(stack.sql("SELECT count(*) FROM dead_letters WHERE replayed_at IS NULL"))
    out = cli(stack.env, "dlq", "replay").strip().splitlines()[-1]  # "replayed N dead letter(s)"
    return {"letters_before": letters, "cli": out, "sent_once_each": out.split()[1] == str(letters)}


def paused_indexer_then_broker_death(stack: Stack) -> dict[str, Any]:
    indexer = next(
        int(p.name)
        for p in Path("/proc").glob("[0-9]*")
        if (p / "cmdline").exists()
        and b"worker\x00indexer" in (p / "cmdline").read_bytes()
        and str(stack.home).encode() in (p / "environ").read_bytes()
    )
    os.kill(indexer, signal.SIGSTOP)
    events = [doc(f"paused-{i}", f"Barbara Liskov note {i}.") for i in range(32)]
    codes = [stack.post(stack.t1, [e]) for e in events]
    restart_broker(stack)
    os.kill(indexer, signal.SIGCONT)
    ids = [e["event_id"] for e in events]
    wait(lambda: stack.applied(ids) == len(ids), 240)
    losses = stack.sql("SELECT json_agg(json_build_object('records', records, 'republished',"
                       " republished)) FROM broker_losses")  # fmt: skip
    return {"accepted_202": codes.count(202), "applied": stack.applied(ids), "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--home", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="kgstream-issue30-"))
    stack = Stack(home)
    results: dict[str, Any] = {}
    try:
        stack.start()
        for name, step in [
            ("1 many groups", many_groups),
            ("2 broker restart", broker_restart),
            ("3 idle POSTs", idle_posts),
            ("4 tenant alias", tenant_alias),
            ("5 dlq replay", replay),
            ("6 paused indexer, broker killed", paused_indexer_then_broker_death),
        ]:
            started = time.monotonic()
            try:
                results[name] = step(stack)
            except Exception as exc:  # noqa: BLE001 - reported, the next finding still runs
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            results[name]["seconds"] = round(time.monotonic() - started, 1)
            print(name, json.dumps(results[name], default=str), flush=True)
    finally:
        stack.stop()
    if args.json:
        print(json.dumps(results, default=str, indent=2))


if __name__ == "__main__":
    main()
