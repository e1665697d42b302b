"""Background lanes for large documents (services/indexer/lanes.py): a held partition's events
are handled by its lane in offset order and by nobody else, the lane starts only when told,
lets its partition go once its queue is empty, keeps it held after a failure, and the agent
waits when too much is held."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from services.indexer.lanes import Lanes


@dataclass(frozen=True)
class Ev:
    partition: int
    offset: int
    size: int = 1


class Handled:
    """The lane's handler: records batches; waits on ``gate`` when one is set."""

    def __init__(self) -> None:
        self.batches: list[list[Ev]] = []
        self.gate: asyncio.Event | None = None
        self.fail = False

    async def __call__(self, batch: list[Ev]) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise RuntimeError("lane broke")
        self.batches.append(batch)


def lanes_for(handled: Handled, batch_size: int = 2, limit: int = 100) -> Lanes[Ev]:
    return Lanes(
        handled,
        partition=lambda e: e.partition,
        size=lambda e: e.size,
        batch_size=batch_size,
        held_limit_bytes=limit,
    )


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_a_held_partition_goes_to_its_lane_in_order_and_is_let_go_when_empty() -> None:
    handled = Handled()
    lanes = lanes_for(handled)
    lanes.hold([Ev(0, 5), Ev(0, 6)])  # the large document and what followed it in its batch
    assert lanes.divert([Ev(1, 1), Ev(0, 7), Ev(1, 2), Ev(0, 8), Ev(0, 9)]) == [Ev(1, 1), Ev(1, 2)]
    await settle()
    assert handled.batches == []  # not started: the events before them are not written yet

    lanes.start([0])
    await settle()
    offsets = [[e.offset for e in b] for b in handled.batches]
    assert offsets == [[5, 6], [7, 8], [9]]
    assert lanes.held() == set()
    assert lanes.divert([Ev(0, 10)]) == [Ev(0, 10)]  # the partition is the agent's again


async def test_events_received_while_a_lane_works_join_it_behind_what_it_has() -> None:
    handled = Handled()
    handled.gate = asyncio.Event()
    lanes = lanes_for(handled, batch_size=16)
    lanes.hold([Ev(0, 1)])
    lanes.start([0])
    await settle()
    assert lanes.divert([Ev(0, 2), Ev(1, 1)]) == [Ev(1, 1)]
    handled.gate.set()
    await settle()
    assert [[e.offset for e in b] for b in handled.batches] == [[1], [2]]
    assert lanes.held() == set()


async def test_a_failed_lane_keeps_its_partition_and_the_agent_raises_it() -> None:
    handled = Handled()
    handled.fail = True
    lanes = lanes_for(handled)
    lanes.hold([Ev(0, 1)])
    lanes.start([0])
    await settle()
    assert lanes.held() == {0}
    with pytest.raises(RuntimeError, match="lane broke"):
        lanes.divert([Ev(0, 2)])
    await lanes.close()


async def test_the_agent_waits_while_too_much_is_held() -> None:
    handled = Handled()
    handled.gate = asyncio.Event()
    lanes = lanes_for(handled, batch_size=1, limit=10)
    lanes.hold([Ev(0, 1, size=8)])
    lanes.divert([Ev(0, 2, size=8)])
    lanes.start([0])
    waiting = asyncio.create_task(lanes.room())
    await settle()
    assert not waiting.done()
    handled.gate.set()
    await asyncio.wait_for(waiting, 5)
    await lanes.close()


async def test_close_cancels_the_lanes() -> None:
    handled = Handled()
    handled.gate = asyncio.Event()
    lanes = lanes_for(handled)
    lanes.hold([Ev(0, 1)])
    lanes.start([0])
    await settle()
    await lanes.close()
    handled.gate.set()
    await settle()
    assert handled.batches == []


async def test_a_revoked_partition_loses_its_lane_and_queue_and_its_events_are_dropped() -> None:
    """A rebalance does not stop the agent: the lane of a revoked partition must not go on
    handling (and acking) a partition another member now owns, and the agent must not handle
    its later events ahead of the dropped ones."""
    handled = Handled()
    handled.gate = asyncio.Event()
    lanes = lanes_for(handled)
    lanes.hold([Ev(0, 5), Ev(0, 6), Ev(0, 7)])
    lanes.hold([Ev(1, 3)])
    lanes.start([0, 1])
    await settle()
    await lanes.revoke([0])
    assert lanes.held() == {1}
    assert lanes.divert([Ev(0, 8), Ev(2, 1)]) == [Ev(2, 1)]  # dropped: unacked, read again
    lanes.hold([Ev(0, 9)])
    assert lanes.held() == {1}
    handled.gate.set()
    await settle()
    assert [[e.offset for e in b] for b in handled.batches] == [[3]]  # partition 1 only
    await asyncio.wait_for(lanes.room(), 5)  # the dropped events no longer count as held

    lanes.assign([0])  # ours again, read again from the committed offset
    assert lanes.divert([Ev(0, 5)]) == [Ev(0, 5)]
    await lanes.close()


async def test_events_fetched_before_the_last_rebalance_are_dropped() -> None:
    handled = Handled()
    stale = {Ev(0, 8)}
    lanes = Lanes(
        handled,
        partition=lambda e: e.partition,
        size=lambda e: e.size,
        batch_size=2,
        current=lambda e: e not in stale,
    )
    assert lanes.divert([Ev(0, 8), Ev(0, 5)]) == [Ev(0, 5)]
    lanes.hold([Ev(0, 8)])
    assert lanes.held() == set()


async def test_a_failed_lane_is_reported_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """The indexer ends the process on it: a restarted agent would start with no lanes."""
    handled = Handled()
    handled.fail = True
    failures: list[BaseException] = []
    lanes = Lanes(
        handled,
        partition=lambda e: e.partition,
        size=lambda e: e.size,
        batch_size=2,
        on_failure=failures.append,
    )
    lanes.hold([Ev(0, 1)])
    lanes.start([0])
    await settle()
    assert [str(f) for f in failures] == ["lane broke"]
    assert "the lane of partition 0 failed" in caplog.text
    assert lanes.held() == {0}
    await lanes.close()
