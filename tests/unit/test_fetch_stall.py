"""The indexer's fetch watch (services/indexer/fetch_stall.py) on a fake clock: a member whose
fetch position does not move while records wait, or stands past records the agent never
received (confirmed by the broker), and the agent is idle is stalled past the limit; work, an
empty partition, a moving position, transaction markers or leaving the group are not stalls."""

from __future__ import annotations

import asyncio

from services.indexer.fetch_stall import (
    Activity,
    FetchStall,
    Sample,
    expected_offsets,
    run_fetch_watch,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _sample(stall: FetchStall, clock: Clock, step: float, **kw: object) -> str | None:
    clock.now += step
    args: dict[str, object] = {"member": True, "busy": False, "positions": {0: 5}, "ends": {0: 9}}
    args.update(kw)
    return stall.observe(**args)  # type: ignore[arg-type]


def test_waiting_records_and_an_unmoved_position_stall_past_the_limit() -> None:
    clock = Clock()
    stall = FetchStall(30, clock)
    assert _sample(stall, clock, 0) is None
    assert _sample(stall, clock, 30) is None  # at the limit, not past it
    reason = _sample(stall, clock, 1)
    assert reason is not None
    assert "partition 0: position 5, end 9, unmoved for 31 s" in reason
    assert "KGSTREAM_INDEXER_REJOIN_TIMEOUT_S" in reason
    assert stall.reason == reason  # kept for /healthz


def test_a_moving_position_is_not_a_stall() -> None:
    clock = Clock()
    stall = FetchStall(30, clock)
    for position in range(1, 9):
        assert _sample(stall, clock, 10, positions={0: position}) is None


def test_no_waiting_records_is_idle_not_stalled() -> None:
    clock = Clock()
    stall = FetchStall(30, clock)
    for _ in range(10):
        assert _sample(stall, clock, 10, positions={0: 9}, ends={0: 9}) is None
    # An end offset below the position (a replaced log) is not waiting either.
    for _ in range(10):
        assert _sample(stall, clock, 10, positions={0: 9}, ends={0: 3}) is None


def test_any_busy_sample_starts_the_count_again() -> None:
    clock = Clock()
    stall = FetchStall(30, clock)
    for _ in range(10):  # a write retried while the database is down, a lane computing
        assert _sample(stall, clock, 20) is None
        assert _sample(stall, clock, 20, busy=True) is None
    assert _sample(stall, clock, 20) is None
    assert _sample(stall, clock, 20) is None
    assert _sample(stall, clock, 20) is not None


def test_out_of_the_group_is_the_rejoin_watchdogs_case() -> None:
    clock = Clock()
    stall = FetchStall(30, clock)
    for _ in range(10):
        assert _sample(stall, clock, 20) is None
        assert _sample(stall, clock, 20, member=False) is None


def test_no_position_while_records_exist_stalls_too() -> None:
    clock = Clock()
    stall = FetchStall(30, clock)
    assert _sample(stall, clock, 0, positions={0: None}, ends={0: 4}) is None
    assert _sample(stall, clock, 31, positions={0: None}, ends={0: 4}) is not None
    fresh = FetchStall(30, clock)
    for _ in range(5):  # an empty partition with no position yet is idle
        assert _sample(fresh, clock, 20, positions={0: None}, ends={0: 0}) is None


def test_partitions_are_counted_apart_and_revoked_ones_forgotten() -> None:
    clock = Clock()
    stall = FetchStall(30, clock)
    assert _sample(stall, clock, 0, positions={0: 5, 1: 0}, ends={0: 9, 1: 4}) is None
    assert _sample(stall, clock, 20, positions={0: 6, 1: 0}, ends={0: 9, 1: 4}) is None
    reason = _sample(stall, clock, 20, positions={0: 7, 1: 0}, ends={0: 9, 1: 4})
    assert reason is not None
    assert "partition 1:" in reason
    assert "partition 0:" not in reason
    other = FetchStall(30, clock)
    assert _sample(other, clock, 0, positions={0: 5, 1: 0}, ends={0: 9, 1: 4}) is None
    assert _sample(other, clock, 20, positions={0: 5}) is None  # 1 revoked, 0 waits 20 s
    assert _sample(other, clock, 20, positions={0: 5, 1: 0}, ends={0: 9, 1: 4}) is not None
    # partition 0 has waited 40 s; partition 1 came back and starts at 0 s
    assert "partition 1:" not in (other.reason or "")


def test_activity_counts_batches_and_lanes() -> None:
    lanes: set[int] = set()
    activity = Activity()
    activity.watch_lanes(lambda: bool(lanes))
    assert not activity.busy
    activity.begin()
    activity.begin()
    activity.end()
    assert activity.busy
    activity.end()
    activity.end()  # never below zero
    assert not activity.busy
    lanes.add(1)
    assert activity.busy


def test_the_watch_hands_over_the_reason_once_and_skips_failed_samples() -> None:
    clock = Clock()
    stall = FetchStall(3, clock)
    samples = iter([RuntimeError("broker unreachable"), *[None] * 10])
    reasons: list[str] = []

    async def sample() -> Sample:
        clock.now += 2
        failure = next(samples)
        if failure is not None:
            raise failure
        return Sample(True, False, {0: 1}, {0: 2})

    async def never_asked(partition: int, start: int) -> int | None:
        raise AssertionError("no suspect: records wait below the position")

    asyncio.run(run_fetch_watch(stall, sample, reasons.append, never_asked, interval_s=0))
    assert len(reasons) == 1
    assert "position 1, end 2" in reasons[0]


def test_records_skipped_past_the_agent_are_suspects_until_the_broker_confirms() -> None:
    # The fetch position (24) moved past records the agent never got (it expects 12); the end
    # offset (13, approximate on tansu) is below the position, so nothing "waits".
    clock = Clock()
    stall = FetchStall(30, clock)
    kw = {"positions": {0: 24}, "ends": {0: 13}, "expected": {0: 12}}
    assert _sample(stall, clock, 0, **kw) is None
    assert _sample(stall, clock, 31, **kw) is None  # past the limit: a suspect, not yet stalled
    [suspect] = stall.suspects
    assert (suspect.partition, suspect.expected, suspect.position) == (0, 12, 24)
    reason = stall.confirm(suspect, 12)  # the broker has a record at 12: never received
    assert reason is not None
    assert "records from 12 never reached the agent" in reason


def test_a_transaction_marker_past_the_last_record_is_not_a_stall() -> None:
    # The last record the agent got is 11; a commit marker at 12 moved the position to 13.
    clock = Clock()
    stall = FetchStall(30, clock)
    kw = {"positions": {0: 13}, "ends": {0: 13}, "expected": {0: 12}}
    assert _sample(stall, clock, 0, **kw) is None
    assert _sample(stall, clock, 31, **kw) is None
    [suspect] = stall.suspects
    assert stall.confirm(suspect, None) is None  # no data record from 12 on
    assert _sample(stall, clock, 20, **kw) is None  # the count started again
    assert stall.suspects == []
    assert _sample(stall, clock, 11, **kw) is None
    [again] = stall.suspects  # asked again one limit later, not at every sample
    assert stall.confirm(again, 40) is None  # a record after the position: not skipped
    assert stall.reason is None


def test_the_watch_asks_the_broker_about_suspects() -> None:
    clock = Clock()
    stall = FetchStall(3, clock)
    reasons: list[str] = []
    asked: list[tuple[int, int]] = []

    async def sample() -> Sample:
        clock.now += 2
        return Sample(True, False, {0: 24, 1: 12}, {0: 13, 1: 12}, {0: 12, 1: 12})

    async def first_record(partition: int, start: int) -> int | None:
        asked.append((partition, start))
        return start

    asyncio.run(run_fetch_watch(stall, sample, reasons.append, first_record, interval_s=0))
    assert asked == [(0, 12)]  # partition 1 is idle: it got everything
    assert len(reasons) == 1
    assert "partition 0: position 24, records from 12 never reached the agent" in reasons[0]


def test_activity_expects_one_past_what_it_received_and_forgets_on_assignment() -> None:
    activity = Activity()
    activity.received([(0, 4), (0, 11), (1, 3), (0, 7)])
    assert activity.expected == {0: 12, 1: 4}
    activity.forget([0])
    assert activity.expected == {1: 4}
    # Unknown to the agent: one past faust's read offset (its seek target or last delivery).
    assert expected_offsets(activity.expected, {0: 30, 1: 2, 2: None}) == {0: 31, 1: 4, 2: None}
