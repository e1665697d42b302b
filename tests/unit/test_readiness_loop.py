"""The query API's readiness thread (services/query_api/readiness.py, services/core/deadline.py):
one check at a time whichever port asks, and nothing restarts once it is closed. No I/O: the
engine is never connected (``_read`` is replaced) and the broker never asked."""

from __future__ import annotations

import asyncio
import inspect
import threading

import pytest

from services.core.deadline import BackgroundLoop, LoopStopped
from services.core.settings import Settings
from services.query_api.readiness import Readiness, ReadyState


class CountingReadiness(Readiness):
    """A check that counts how many run at once."""

    def __init__(self) -> None:
        url = "postgresql+psycopg://nobody@127.0.0.1:9/nothing"
        # These tests are not about the budget: a loaded machine may take longer than the
        # default 0.8 s to run a 0.3 s check.
        super().__init__(Settings(database_url=url, readiness_budget_s=30), url, "127.0.0.1:9")
        self.running = self.most = 0

    async def _read(self) -> ReadyState:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.3)
            return ReadyState(None, {"partitions": [], "lag_source": "none"})
        finally:
            self.running -= 1


async def test_both_ports_share_one_check() -> None:
    """Failed before: the API's port and the probes port had a single-flight check each, so
    two checks ran at once on a pool of 1 + 1 connections."""
    readiness = CountingReadiness()
    try:
        here = asyncio.wrap_future(readiness.on_loop(readiness.answer_here()))
        answers = await asyncio.gather(readiness.answer(), here, readiness.answer())
        assert [code for code, _ in answers] == [200, 200, 200]
        assert readiness.most == 1
    finally:
        await asyncio.to_thread(readiness.close)


async def test_a_probe_after_close_starts_nothing() -> None:
    """Failed before: a probe arriving after close() started a new thread and connections."""
    before = set(threading.enumerate())  # other tests' apps may have left theirs running
    readiness = CountingReadiness()
    assert (await readiness.answer())[0] == 200
    await asyncio.to_thread(readiness.close)
    code, body = await readiness.answer()
    assert code == 503
    assert "stopped" in body["detail"]
    started = set(threading.enumerate()) - before
    assert not [t for t in started if t.name == "kgstream-readiness"]


async def running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def test_a_stopped_background_loop_is_closed_and_refuses_work() -> None:
    background = BackgroundLoop("kgstream-test-loop")
    loop = background.submit(running_loop()).result(5)
    background.stop()
    assert loop.is_closed()
    work = asyncio.sleep(0)
    with pytest.raises(LoopStopped):
        background.submit(work)
    assert inspect.getcoroutinestate(work) == "CORO_CLOSED"  # no "never awaited" warning
    assert not [t for t in threading.enumerate() if t.name == "kgstream-test-loop"]
