"""`kgstream up` and `kgstream demo`: bring infrastructure, migrations and the worker processes
up in the foreground, and take all of it down again on Ctrl-C or when the demo ends. An indexer
that exits (e.g. its rejoin watchdog: services/indexer/membership.py) is restarted with a
bounded backoff; any other process that exits ends the stack."""

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

RESTARTED = ("indexer",)
"""Processes restarted when they exit: the indexer resumes from its committed offsets."""


class RestartPolicy:
    """Backoff between restarts of one process: ``base_s``, doubling up to ``cap_s``. A process
    that ran for ``stable_s`` before exiting starts the count again; after ``max_quick``
    restarts in a row that each exited sooner, it gives up (a crash loop, e.g. bad settings)."""

    def __init__(
        self,
        base_s: float = 1.0,
        cap_s: float = 30.0,
        stable_s: float = 60.0,
        max_quick: int = 5,
    ) -> None:
        self.base_s, self.cap_s, self.stable_s, self.max_quick = base_s, cap_s, stable_s, max_quick
        self.quick = 0
        self.started_at = time.monotonic()
        self.due_at: float | None = None

    def on_exit(self, now: float) -> float | None:
        """The process exited at ``now``: seconds to wait before restarting it, or None to give
        up. Schedules the restart (``due_at``)."""
        if now - self.started_at >= self.stable_s:
            self.quick = 0
        self.quick += 1
        if self.quick > self.max_quick:
            return None
        delay = min(self.cap_s, self.base_s * 2.0 ** (self.quick - 1))
        self.due_at = now + delay
        return delay

    def on_start(self, now: float) -> None:
        """The process was (re)started at ``now``."""
        self.started_at, self.due_at = now, None


@dataclass
class Stack:
    """The running processes and where they listen."""

    endpoints: Endpoints
    api_url: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    restarts: dict[str, RestartPolicy] = field(default_factory=dict)

    def start(self, name: str) -> None:
        """Start (or restart) the ``kgstream worker NAME`` process."""
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", "worker", name], env=self.env
        )
        if name in RESTARTED:
            self.restarts.setdefault(name, RestartPolicy()).on_start(time.monotonic())

    def check_alive(self) -> None:
        """Restart an indexer that exited once its backoff has passed; raise if another process
        exited, or if the indexer keeps exiting soon after each start."""
        now = time.monotonic()
        for name, proc in list(self.processes.items()):
            code = proc.poll()
            if code is None:
                continue
            policy = self.restarts.get(name)
            if policy is None:
                raise RuntimeError(f"the {name} process exited with code {code}")
            if policy.due_at is None:
                delay = policy.on_exit(now)
                if delay is None:
                    raise RuntimeError(
                        f"the {name} process exited with code {code}, {policy.quick} times in a "
                        f"row within {policy.stable_s:g} s of starting: not restarting it again"
                    )
                _say(
                    f"the {name} process exited with code {code}: restarting it in {delay:g} s "
                    f"(restart {policy.quick} of at most {policy.max_quick} in a row)"
                )
            elif now >= policy.due_at:
                self.start(name)
                _say(f"restarted the {name} process (pid {self.processes[name].pid})")

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
    stack = Stack(endpoints, f"http://{settings.api_host}:{api_port}", env=env)
    try:
        for name in ("indexer", "communities", "query-api"):
            stack.start(name)
        wait_http(stack, f"{stack.api_url}/readyz", timeout=120)
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
    """Poll a URL until it answers 200, failing fast if a worker dies meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_alive()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not become ready within {timeout:.0f}s")


def _say(line: str) -> None:
    print(f"kgstream up: {line}", file=sys.stderr, flush=True)


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
