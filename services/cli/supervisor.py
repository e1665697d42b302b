"""`kgstream up` and `kgstream demo`: bring infrastructure, migrations and the worker processes
up in the foreground, and take all of it down again on Ctrl-C or when the demo ends.

Every worker that exits (a crash, a kill, the indexer's rejoin watchdog:
services/indexer/membership.py) is started again after a backoff (services/cli/restarts.py);
a crash loop is reported and retried at the capped backoff for as long as `up` runs, because a
dead worker must never take the infrastructure, and the events the broker holds, down with it.
Only before the stack was ready the first time does a crash loop end `up` (bad settings: nothing
was served yet). The embedded servers are watched too (services/cli/infra_watch.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from services.cli.infra_watch import InfraWatch, say
from services.cli.restarts import RestartPolicy
from services.core.db import migrations
from services.core.db.engine import make_engine
from services.core.infra.manager import (
    Endpoints,
    infra_down,
    infra_status,
    infra_up,
    resolve_endpoints,
)
from services.core.processes import host_name, live_processes
from services.core.settings import Settings

STOP_GRACE_S = 30.0
"""How long a worker sent SIGTERM may take to stop before it is sent SIGKILL."""

WORKERS = ("indexer", "communities", "query-api")
"""The processes `up` starts, and starts again whenever one exits: the indexer resumes from its
committed offsets, the communities worker from the database, and the query API keeps no state."""


@dataclass
class Stack:
    """The running processes and where they listen."""

    endpoints: Endpoints
    api_url: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    restarts: dict[str, RestartPolicy] = field(default_factory=dict)
    infra: InfraWatch | None = None
    ready: bool = False
    """Set once the stack first answered /readyz: from then on no exit ends it."""
    stopping: dict[str, float] = field(default_factory=dict)
    """Workers stopped for a planned restart (``move_to``), and when SIGKILL is due."""

    def start(self, name: str) -> None:
        """Start (or restart) the ``kgstream worker NAME`` process."""
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", "worker", name], env=self.env
        )
        self.restarts.setdefault(name, RestartPolicy()).on_start(time.monotonic())

    def check_alive(self) -> None:
        """Restart each worker that exited once its backoff has passed, and the embedded
        servers (``infra``); raise only for a crash loop before the stack was first ready."""
        now = time.monotonic()
        if self.infra is not None:
            moved = self.infra.check(now)
            if moved is not None and moved != self.endpoints:
                self.move_to(moved)
        for name, proc in list(self.processes.items()):
            code = proc.poll()
            if code is None:
                if now >= self.stopping.get(name, float("inf")):
                    say(f"the {name} process ignored SIGTERM for {STOP_GRACE_S:g} s: killing it")
                    proc.kill()
                    self.stopping[name] = float("inf")  # killed once; its exit is awaited
                continue
            policy = self.restarts[name]
            if self.stopping.pop(name, None) is not None:
                policy.on_planned_exit(now)  # not a crash: no backoff, no crash loop
                say(f"the {name} process stopped (code {code}) for a planned restart")
            if policy.due_at is None:
                delay = policy.on_exit(now)
                if policy.crash_looping and not self.ready:
                    raise RuntimeError(
                        f"the {name} process exited with code {code}, {policy.quick} times in a "
                        f"row within {policy.stable_s:g} s of starting: not restarting it again"
                    )
                say(f"the {name} process exited with code {code}: restarting it in {delay:g} s")
                if policy.crash_looping:
                    say(
                        f"CRASH LOOP: the {name} process exited {policy.quick} times in a row "
                        f"within {policy.stable_s:g} s of starting (its log above says why); "
                        f"restarting it every {policy.cap_s:g} s while the rest keeps running"
                    )
            elif now >= policy.due_at:
                self.start(name)
                say(f"restarted the {name} process (pid {self.processes[name].pid})")

    def move_to(self, endpoints: Endpoints) -> None:
        """Restart every running worker on ``endpoints`` (a restarted embedded server found its
        old port taken): SIGTERM now, SIGKILL after ``STOP_GRACE_S``; the restart is planned,
        so it resets the worker's backoff instead of counting as a quick exit."""
        self.endpoints = endpoints
        self.env["KGSTREAM_DATABASE_URL"] = endpoints.database_url
        self.env["KGSTREAM_KAFKA_BOOTSTRAP_SERVERS"] = endpoints.kafka_bootstrap_servers
        say("the embedded servers moved to new ports: restarting the workers")
        now = time.monotonic()
        for name, proc in self.processes.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                self.stopping[name] = now + STOP_GRACE_S

    def metrics_urls(self, timeout: float = 60) -> dict[str, str | None]:
        """Each process's metrics address from the processes table, once all registered
        (those still missing after ``timeout`` seconds are left out)."""
        pids = {proc.pid: name for name, proc in self.processes.items()}
        found: dict[str, str | None] = {}
        deadline = time.monotonic() + timeout
        while len(found) < len(pids) and time.monotonic() < deadline:
            self.check_alive()
            rows = asyncio.run(_live(self.endpoints.database_url))
            here = host_name()
            found = {
                pids[r["pid"]]: r["metrics_url"]
                for r in rows
                if r["pid"] in pids and r["host"] == here
            }
            if len(found) < len(pids):
                time.sleep(0.5)
        return {name: found[name] for name in self.processes if name in found}


def prepare(settings: Settings, say: bool = True) -> Endpoints:
    """Infrastructure (what is not configured), migrations and topics."""
    infra_up(settings)  # also creates the topics explicitly
    endpoints = resolve_endpoints(settings)
    if say:
        print(f"postgres: {endpoints.to_dict()['database_url']}", flush=True)
        print(f"kafka:    {endpoints.kafka_bootstrap_servers}", flush=True)
    migrations.upgrade(endpoints.database_url, settings.embedding_dim)
    return endpoints


@contextlib.contextmanager
def running_stack(
    settings: Settings,
    api_port: int,
    child_log_level: str | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[Stack]:
    """Start infra (if needed), migrate, start the indexer, the communities worker and the
    query API (``extra_env`` added to their environment); stop all of it on exit, including
    infrastructure this call started."""
    was_running = _infra_alive(settings)
    endpoints = prepare(settings)
    env = {
        **os.environ,
        "KGSTREAM_DATABASE_URL": endpoints.database_url,
        "KGSTREAM_KAFKA_BOOTSTRAP_SERVERS": endpoints.kafka_bootstrap_servers,
        "KGSTREAM_API_PORT": str(api_port),
        "KGSTREAM_HOME": str(settings.home_dir),
        "KGSTREAM_LOG_LEVEL": child_log_level or settings.log_level,
        **(extra_env or {}),
    }
    infra = InfraWatch(settings, owned=not was_running)
    stack = Stack(endpoints, f"http://{settings.api_host}:{api_port}", env=env, infra=infra)
    try:
        for name in WORKERS:
            stack.start(name)
        wait_http(stack, f"{stack.api_url}/readyz", timeout=120)
        stack.ready = True
        yield stack
    finally:
        for proc in stack.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in stack.processes.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if not was_running:
            infra_down(settings)


def wait_http(stack: Stack, url: str, timeout: float) -> None:
    """Poll a URL until it answers 200, failing fast if a worker crash-loops meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_alive()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not become ready within {timeout:.0f}s")


def _infra_alive(settings: Settings) -> bool:
    state = infra_status(settings)
    return state.postgres.alive and state.broker.alive


async def _live(database_url: str) -> list[dict[str, Any]]:
    engine = make_engine(database_url, pool_size=1)
    try:
        async with engine.connect() as conn:
            return await live_processes(conn)
    finally:
        await engine.dispose()
