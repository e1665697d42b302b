"""The indexer's rejoin watchdog (services/indexer/membership.py) and its /healthz, on fake
clocks (the restarts of `kgstream up`: tests/unit/test_supervisor.py)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import cast

import pytest
from aiohttp import web

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
