"""The indexer's rejoin watchdog (services/indexer/membership.py), its /healthz, and the restart
backoff of `kgstream up` (services/cli/supervisor.py), on fake clocks and fake processes."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, cast

import pytest
from aiohttp import web

from services.cli.supervisor import RESTARTED, RestartPolicy, Stack
from services.core.infra.manager import Endpoints
from services.core.settings import Settings
from services.core.telemetry.server import OpsServer
from services.indexer.consumer_state import _chain, describe
from services.indexer.membership import (
    Membership,
    RejoinWatchdog,
    rejoin_timeout_s,
    run_watchdog,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


def test_membership_counts_from_start_until_assigned() -> None:
    clock = Clock()
    m = Membership("docs", clock)
    clock.now += 30
    assert m.absent_for() == 30
    m.on_assigned({TP("docs", 0), TP("other", 1)})
    assert m.joined
    assert m.assigned == {("docs", 0)}
    clock.now += 500
    assert m.absent_for() == 0


def test_repeated_revocations_do_not_restart_the_clock() -> None:
    clock = Clock()
    m = Membership("docs", clock)
    m.on_assigned({TP("docs", 0)})
    clock.now += 10
    m.on_revoked()
    clock.now += 50
    m.on_revoked()  # a consumer that keeps failing to rejoin
    clock.now += 50
    assert m.absent_for() == 100


def test_watchdog_fires_only_past_the_limit_and_rearms_on_rejoin() -> None:
    clock = Clock()
    m = Membership("docs", clock)
    dog = RejoinWatchdog(m, "kgstream-indexer", timeout_s=60)
    m.on_assigned({TP("docs", 0)})
    m.on_revoked()
    clock.now += 60
    assert dog.overdue() is None
    clock.now += 1
    reason = dog.overdue()
    assert reason is not None
    assert "kgstream-indexer" in reason
    assert "KGSTREAM_INDEXER_REJOIN_TIMEOUT_S" in reason
    m.on_assigned(set())  # joined with no partitions still counts as a member
    assert dog.overdue() is None


def test_default_limit_is_twenty_session_timeouts() -> None:
    assert rejoin_timeout_s(None, 6.0) == 120.0
    assert rejoin_timeout_s(30.0, 6.0) == 30.0
    assert Settings().indexer_rejoin_timeout_s is None
    with pytest.raises(ValueError, match="greater than 0"):
        Settings(indexer_rejoin_timeout_s=0)


async def test_run_watchdog_hands_over_the_reason_once_overdue() -> None:
    clock = Clock()
    m = Membership("docs", clock)
    dog = RejoinWatchdog(m, "g", timeout_s=5)
    exits: list[str] = []
    checks = 0

    def overdue() -> str | None:
        nonlocal checks
        checks += 1
        clock.now += 2  # time passes between checks
        return RejoinWatchdog.overdue(dog)

    dog.overdue = overdue  # type: ignore[method-assign]
    await run_watchdog(dog, exits.append, interval_s=0)
    assert len(exits) == 1
    assert checks == 3  # 2 s, 4 s: fine; 6 s: over the 5 s limit


async def test_healthz_reports_the_watchdog_reason() -> None:
    reason: str | None = None

    async def ready() -> str | None:
        return None

    server = OpsServer("127.0.0.1", 0, ready, live=lambda: reason)
    request = cast(web.Request, None)
    ok = await server._healthz(request)
    assert ok.status == 200
    reason = "the consumer has not been a member of group g for 130 s"
    bad = await server._healthz(request)
    assert bad.status == 503
    assert json.loads(cast(bytes, bad.body)) == {"status": "unhealthy", "reason": reason}


def test_restart_backoff_doubles_to_a_cap_and_gives_up_on_a_crash_loop() -> None:
    policy = RestartPolicy(base_s=1, cap_s=4, stable_s=60, max_quick=4)
    policy.on_start(0)
    assert [policy.on_exit(1), policy.on_exit(2), policy.on_exit(3), policy.on_exit(4)] == [
        1,
        2,
        4,
        4,
    ]
    assert policy.on_exit(5) is None


def test_restart_backoff_resets_after_a_stable_run() -> None:
    policy = RestartPolicy(base_s=1, cap_s=30, stable_s=60, max_quick=2)
    policy.on_start(0)
    assert policy.on_exit(1) == 1
    policy.on_start(2)
    assert policy.on_exit(3) == 2
    policy.on_start(5)
    assert policy.on_exit(500) == 1  # it ran for 495 s: a new count


class FakeProc:
    def __init__(self, pid: int, code: int | None = None) -> None:
        self.pid, self.returncode = pid, code

    def poll(self) -> int | None:
        return self.returncode


def test_stack_restarts_an_exited_indexer_after_its_backoff(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    now = [100.0]
    monkeypatch.setattr("services.cli.supervisor.time.monotonic", lambda: now[0])
    started: list[str] = []
    stack = Stack(cast(Endpoints, None), "http://api")

    def start(name: str) -> None:
        started.append(name)
        stack.processes[name] = cast(Any, FakeProc(len(started)))
        if name in RESTARTED:  # as Stack.start does
            stack.restarts.setdefault(name, RestartPolicy()).on_start(now[0])

    monkeypatch.setattr(stack, "start", start)
    start("indexer")
    start("query-api")
    stack.processes["indexer"].returncode = 3
    stack.check_alive()  # noticed: restart in 1 s
    assert started == ["indexer", "query-api"]
    assert "indexer process exited with code 3: restarting it in 1 s" in capsys.readouterr().err
    now[0] += 1
    stack.check_alive()
    assert started == ["indexer", "query-api", "indexer"]
    assert stack.processes["indexer"].poll() is None
    assert "restarted the indexer process" in capsys.readouterr().err

    stack.processes["query-api"].returncode = 1
    with pytest.raises(RuntimeError, match="query-api process exited with code 1"):
        stack.check_alive()


async def test_consumer_state_names_where_tasks_wait_and_never_raises() -> None:
    assert describe(object()).startswith("consumer state unavailable (AttributeError")

    async def inner(gate: asyncio.Event) -> None:
        await gate.wait()

    async def outer(gate: asyncio.Event) -> None:
        await inner(gate)

    gate = asyncio.Event()
    task = asyncio.create_task(outer(gate))
    await asyncio.sleep(0)
    chain = _chain(task.get_coro())
    assert chain.startswith("outer:")
    assert " > inner:" in chain
    assert " > wait:" in chain
    gate.set()
    await task
