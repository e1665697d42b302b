"""A consumer that is a member of its group, owns partitions whose records wait, and has stopped
fetching them while the agent has nothing to do: the other half of the rejoin watchdog
(membership.py), which only sees a consumer out of its group.

Seen in tests/integration/test_rejoin.py about once in four loaded runs (issue 30): an indexer
stopped past its session timeout, whose pending commit failed with UnknownMemberIdError, rejoined
and got its partitions back, then fetched nothing for minutes while records waited. Its group
membership was fine, so nothing noticed. Whatever the cause inside faust or aiokafka (a paused
flow, a fetcher waiting on a position that never resets), the remedy is the watchdog's: log what
the consumer is doing (consumer_state.py) and exit to be restarted; the new process resumes from
the committed offsets and skips what was applied (by event id), so nothing is lost or doubled.

Stalled, per partition: records wait (the broker's end offset is above the consumer's fetch
position, or the consumer has no position while records exist) and the fetch position has not
moved for longer than the limit, every sample of which found the agent idle (no batch being
computed or written, no large-document lane) and the consumer a member. Any busy sample starts
the count again: an agent retrying a write while the database is down, a lane computing a large
document, or a full buffer that paused fetching are work, not a stall. The fetch position is the
consumer's (it moves past transaction markers that are never delivered), not the last record the
agent saw. The embedded broker's end offsets can lag the true end (docs/architecture.md): that
can hide a stall, never invent one."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from aiokafka import TopicPartition  # the consumer's own type, for its state table

log = logging.getLogger(__name__)
Clock = Callable[[], float]


class Activity:
    """What the agent is doing: the batches between the start of their compute phase and the
    end of their write phase, and whether a lane holds a partition."""

    def __init__(self, lanes_busy: Callable[[], bool] = lambda: False) -> None:
        self.batches = 0
        self._lanes_busy = lanes_busy

    def begin(self) -> None:
        self.batches += 1

    def end(self) -> None:
        self.batches = max(0, self.batches - 1)

    def watch_lanes(self, lanes_busy: Callable[[], bool]) -> None:
        self._lanes_busy = lanes_busy

    @property
    def busy(self) -> bool:
        return self.batches > 0 or self._lanes_busy()


class FetchStall:
    """Says why the process should be restarted once an owned partition has had records waiting
    and an unmoved fetch position for longer than ``timeout_s`` while the agent was idle."""

    def __init__(self, timeout_s: float, clock: Clock = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._since: dict[int, tuple[int | None, float]] = {}  # partition -> (position, since)
        self.reason: str | None = None

    def observe(
        self,
        *,
        member: bool,
        busy: bool,
        positions: Mapping[int, int | None],
        ends: Mapping[int, int],
    ) -> str | None:
        """One sample: ``positions``, the consumer's fetch position per owned partition (None:
        it has none yet); ``ends``, the broker's end offsets. The reason once stalled."""
        now = self._clock()
        if not member or busy:
            self._since.clear()
            return None
        for gone in set(self._since) - set(positions):
            del self._since[gone]
        stalled: list[str] = []
        for partition, position in sorted(positions.items()):
            end = ends.get(partition)
            waiting = end is not None and end > (position if position is not None else 0)
            seen = self._since.get(partition)
            if not waiting or seen is None or seen[0] != position:
                self._since[partition] = (position, now)
                continue
            if now - seen[1] > self.timeout_s:
                stalled.append(
                    f"partition {partition}: position {position}, end {end}, "
                    f"unmoved for {now - seen[1]:.0f} s"
                )
        if stalled:
            self.reason = (
                "the consumer is a member of its group but has not fetched the records waiting "
                f"on its partitions while it had nothing to do ({'; '.join(stalled)}; limit "
                f"{self.timeout_s:g} s, KGSTREAM_INDEXER_REJOIN_TIMEOUT_S)"
            )
        return self.reason


async def run_fetch_watch(
    stall: FetchStall,
    sample: Callable[[], Awaitable[tuple[bool, bool, dict[int, int | None], dict[int, int]]]],
    on_stalled: Callable[[str], None],
    interval_s: float = 2.0,
) -> None:
    """Every ``interval_s``, ``sample`` (member, busy, positions, ends) and observe it; once
    stalled, hand the reason to ``on_stalled`` (which ends the process) and return. A sample
    that fails (the broker unreachable) is skipped: it says nothing about the consumer."""
    failures: set[str] = set()
    first = True
    while True:
        await asyncio.sleep(interval_s)
        try:
            member, busy, positions, ends = await sample()
        except Exception as exc:  # noqa: BLE001 - the next sample tries again
            # Once per kind: a consumer whose private state moved (a faust or aiokafka upgrade)
            # would otherwise turn the watch off without a word.
            level = logging.DEBUG if type(exc).__name__ in failures else logging.WARNING
            failures.add(type(exc).__name__)
            log.log(level, "fetch watch: sample failed: %s: %s", type(exc).__name__, exc)
            continue
        if first and positions:
            first = False
            log.info("fetch watch: first sample: positions %s, end offsets %s", positions, ends)
        reason = stall.observe(member=member, busy=busy, positions=positions, ends=ends)
        if reason is not None:
            on_stalled(reason)
            return


def fetch_positions(app: object, topic: str, partitions: set[int]) -> dict[int, int | None]:
    """The consumer's fetch position of each of ``partitions`` (None: none yet), read from
    aiokafka's subscription state, as faust's own slow-processing check reads it. Raises when
    the consumer or a partition's state is not there (the caller skips the sample)."""
    consumer = app.consumer._thread._consumer  # type: ignore[attr-defined]
    assignment = consumer._fetcher._subscriptions.subscription.assignment
    out: dict[int, int | None] = {}
    for partition in partitions:
        state = assignment.state_value(TopicPartition(topic, partition))
        if state is None:
            raise LookupError(f"no fetch state for {topic}/{partition}")
        out[partition] = state.position if state.has_valid_position else None
    return out
