"""services/indexer/pipeline.py: the compute of batch N+1 overlaps the write of batch N; writes
run one at a time in order; at most one batch is prepared ahead; a stop cancels the write in
flight. Stages are gated by events, so the interleaving is forced, not timed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from services.indexer.pipeline import run_pipelined


class Stages:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.release: dict[int, asyncio.Event] = {}

    def gate(self, n: int) -> asyncio.Event:
        return self.release.setdefault(n, asyncio.Event())

    async def prepare(self, n: int) -> str:
        self.log.append(f"prepare {n}")
        return f"p{n}"

    async def write(self, n: int, prepared: str) -> None:
        assert prepared == f"p{n}"
        self.log.append(f"write {n}")
        await self.gate(n).wait()
        self.log.append(f"acked {n}")


async def batches(n: int, *, stay_open: bool = False) -> AsyncIterator[int]:
    for i in range(n):
        yield i
    if stay_open:
        await asyncio.Event().wait()


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_the_next_batch_is_prepared_while_one_is_written_and_acks_follow_in_order() -> None:
    stages = Stages()
    task = asyncio.create_task(run_pipelined(batches(3), stages.prepare, stages.write))
    await settle()
    # 0 is being written, 1 is prepared and waits; 2 is not prepared (one batch ahead only).
    assert stages.log[0] == "prepare 0"
    assert sorted(stages.log[1:]) == ["prepare 1", "write 0"]
    stages.gate(0).set()
    await settle()
    # 0 acked; then 1 is written while 2 is prepared.
    assert stages.log[3] == "acked 0"
    assert sorted(stages.log[4:]) == ["prepare 2", "write 1"]
    stages.gate(1).set()
    await settle()
    assert stages.log[6:] == ["acked 1", "write 2"]
    stages.gate(2).set()
    await task
    assert stages.log[8:] == ["acked 2"]


async def test_a_stop_cancels_the_write_in_flight_and_acks_nothing_after() -> None:
    stages = Stages()
    task = asyncio.create_task(
        run_pipelined(batches(2, stay_open=True), stages.prepare, stages.write)
    )
    await settle()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    stages.gate(0).set()
    stages.gate(1).set()
    await settle()
    assert sorted(stages.log) == ["prepare 0", "prepare 1", "write 0"]
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


async def test_a_failing_write_surfaces_and_stops_the_pipeline() -> None:
    log: list[str] = []

    async def prepare(n: int) -> int:
        log.append(f"prepare {n}")
        return n

    async def write(n: int, _: int) -> None:
        if n == 0:
            raise RuntimeError("boom")
        log.append(f"write {n}")

    with pytest.raises(RuntimeError, match="boom"):
        await run_pipelined(batches(3), prepare, write)
    assert "write 1" not in log
