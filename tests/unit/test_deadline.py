"""Answers within a budget (services/core/deadline.py), the progress writer's epochs
(services/indexer/positions.py) and the database bounds every engine carries."""

from __future__ import annotations

import asyncio

import pytest

from services.core.db.engine import DbTimeouts
from services.core.deadline import DeadlineExceeded, SingleFlight, run_within
from services.core.settings import Settings
from services.indexer.positions import Positions


async def test_a_hung_check_is_reported_within_the_budget_and_not_repeated() -> None:
    release = asyncio.Event()
    started = 0

    async def check() -> str:
        nonlocal started
        started += 1
        await release.wait()
        return "answered"

    probe = SingleFlight(check, budget_s=0.05, give_up_s=60, what="the database")
    for _ in range(3):
        with pytest.raises(DeadlineExceeded, match="the database did not answer"):
            await probe()
    assert started == 1  # later callers do not pile more checks behind the hung one
    release.set()
    await asyncio.sleep(0.01)  # the hung check ends; the next caller starts a fresh one
    assert await probe() == "answered"
    assert started == 2


async def test_a_check_stuck_past_give_up_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def check() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    probe = SingleFlight(check, budget_s=0.01, give_up_s=0.02, what="x")
    with pytest.raises(DeadlineExceeded):
        await probe()
    await asyncio.sleep(0.05)
    with pytest.raises(DeadlineExceeded):
        await probe()
    await asyncio.wait_for(cancelled.wait(), 1)


def test_run_within_returns_or_gives_up() -> None:
    async def quick() -> int:
        return 7

    async def slow() -> int:
        await asyncio.sleep(30)
        return 0

    assert run_within(quick, 5, "quick") == 7
    with pytest.raises(DeadlineExceeded, match=r"slow did not answer within 0\.1 s"):
        run_within(slow, 0.1, "slow")


def test_the_consumer_going_back_starts_a_new_epoch() -> None:
    positions = Positions()
    assert positions.went_back(("t", 0), 10)  # first batch of this process: taken as is
    positions.recorded[("t", 0)] = 10
    assert not positions.went_back(("t", 0), 12)
    assert positions.went_back(("t", 0), 3)  # offsets reset (broker restart) or redelivery
    assert positions.went_back(("t", 1), 500)


def test_every_connection_carries_the_configured_bounds() -> None:
    settings = Settings(db_connect_timeout_s=3, db_statement_timeout_s=12.5)
    assert DbTimeouts.from_settings(settings).connect_args() == {
        "connect_timeout": 3,
        "options": "-c statement_timeout=12500",
    }
    longer = DbTimeouts.from_settings(settings, statement_s=0)
    assert longer.connect_args()["options"] == "-c statement_timeout=0"  # 0: no limit
