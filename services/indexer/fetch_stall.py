"""A consumer that is a member of its group, owns partitions whose records wait, and has stopped
handing them to the agent while the agent has nothing to do: the other half of the rejoin
watchdog (membership.py), which only sees a consumer out of its group.

Seen in tests/integration/test_rejoin.py (issue 30): an indexer stopped past its session
timeout, whose pending commit failed with UnknownMemberIdError, rejoined and got its partitions
back, then applied nothing for minutes while records waited. Its group membership was fine, so
nothing noticed. Two shapes were seen: the fetch position stood still below the end; and the
fetch position moved past records the agent never received (faust's fetch loop drops the rest
of a fetched batch when the consumer generation changes under it, without seeking back). Either
way the remedy is the watchdog's: log what the consumer is doing (consumer_state.py) and exit to
be restarted; the new process resumes from the committed offsets and skips what was applied (by
event id), so nothing is lost or doubled.

Stalled, per partition, once its fetch position has not moved for longer than the limit, every
sample of which found the agent idle (no batch being computed or written, no large-document
lane) and the consumer a member, while either
- records wait: the broker's end offset is above the fetch position (or the consumer has no
  position while records exist); or
- records were skipped: the fetch position is above the next offset the agent expects (one past
  the last record it received; before it received any, faust's read offset, + 1) and the broker
  confirms a data record in between (a transaction marker, which the agent never receives,
  moves the position too: a probe reads the first record from the expected offset; none before
  the position starts the count again).
Any busy sample starts the count again: an agent retrying a write while the database is down, a
lane computing a large document, or a full buffer that paused fetching are work, not a stall.
The embedded broker's end offsets can lag the true end (docs/architecture.md): that can hide a
stall of the first kind, never invent one."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from aiokafka import TopicPartition  # the consumer's own type, for its state table

log = logging.getLogger(__name__)
Clock = Callable[[], float]


class Activity:
    """What the agent is doing: the batches between the start of their compute phase and the
    end of their write phase, and whether a lane holds a partition."""

    def __init__(self, lanes_busy: Callable[[], bool] = lambda: False) -> None:
        self.batches = 0
        self._lanes_busy = lanes_busy
        self.expected: dict[int, int] = {}  # partition -> one past the last offset received

    def forget(self, partitions: Iterable[int]) -> None:
        """Newly assigned partitions: what the agent received of them before says nothing now."""
        for partition in partitions:
            self.expected.pop(partition, None)

    def received(self, offsets: Iterable[tuple[int, int]]) -> None:
        """The agent got the records at these (partition, offset)s."""
        for partition, offset in offsets:
            if offset + 1 > self.expected.get(partition, -1):
                self.expected[partition] = offset + 1

    def begin(self) -> None:
        self.batches += 1

    def end(self) -> None:
        self.batches = max(0, self.batches - 1)

    def watch_lanes(self, lanes_busy: Callable[[], bool]) -> None:
        self._lanes_busy = lanes_busy

    @property
    def busy(self) -> bool:
        return self.batches > 0 or self._lanes_busy()


@dataclass(frozen=True)
class Sample:
    """What the watch reads every interval: membership, work, and per owned partition the
    consumer's fetch position (None: none yet), the broker's end offset and the next offset the
    agent expects (None: unknown)."""

    member: bool
    busy: bool
    positions: Mapping[int, int | None] = field(default_factory=dict)
    ends: Mapping[int, int] = field(default_factory=dict)
    expected: Mapping[int, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Skipped:
    """A partition whose fetch position stood above the agent's expected offset past the
    limit: stalled if the broker holds a data record in [expected, position)."""

    partition: int
    expected: int
    position: int
    unmoved_s: float


class FetchStall:
    """Says why the process should be restarted once an owned partition has had records waiting
    or skipped, and an unmoved fetch position, for longer than ``timeout_s`` while the agent was
    idle. Skipped records are suspects until the broker confirms them (:meth:`confirm`)."""

    def __init__(self, timeout_s: float, clock: Clock = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._since: dict[int, tuple[int | None, float]] = {}  # partition -> (position, since)
        self.reason: str | None = None
        self.suspects: list[Skipped] = []

    def observe(
        self,
        *,
        member: bool,
        busy: bool,
        positions: Mapping[int, int | None],
        ends: Mapping[int, int],
        expected: Mapping[int, int | None] | None = None,
    ) -> str | None:
        """One sample: ``positions``, the consumer's fetch position per owned partition (None:
        it has none yet); ``ends``, the broker's end offsets; ``expected``, the next offset the
        agent expects. The reason once stalled; :attr:`suspects` lists the partitions whose
        skipped records await confirmation."""
        now = self._clock()
        self.suspects = []
        if not member or busy:
            self._since.clear()
            return None
        for gone in set(self._since) - set(positions):
            del self._since[gone]
        stalled: list[str] = []
        for partition, position in sorted(positions.items()):
            end = ends.get(partition)
            waiting = end is not None and end > (position if position is not None else 0)
            want = (expected or {}).get(partition)
            skipped = want is not None and position is not None and position > want
            seen = self._since.get(partition)
            if not (waiting or skipped) or seen is None or seen[0] != position:
                self._since[partition] = (position, now)
                continue
            unmoved = now - seen[1]
            if unmoved <= self.timeout_s:
                continue
            if waiting:
                stalled.append(
                    f"partition {partition}: position {position}, end {end}, "
                    f"unmoved for {unmoved:.0f} s"
                )
            elif want is not None and position is not None:  # skipped
                self.suspects.append(Skipped(partition, want, position, unmoved))
        if stalled:
            self._stalled(stalled)
        return self.reason

    def confirm(self, suspect: Skipped, first: int | None) -> str | None:
        """The broker's first data record at or after the suspect's expected offset (None: none
        found): below the position, the agent never received it (stalled); else only markers
        were passed, and the count starts again."""
        if first is not None and first < suspect.position:
            self._stalled(
                [
                    f"partition {suspect.partition}: position {suspect.position}, records from "
                    f"{first} never reached the agent (it expects {suspect.expected}), "
                    f"unmoved for {suspect.unmoved_s:.0f} s"
                ]
            )
        else:
            self._since[suspect.partition] = (suspect.position, self._clock())
        return self.reason

    def _stalled(self, why: list[str]) -> None:
        self.reason = (
            "the consumer is a member of its group but has not handed the agent the records "
            f"waiting on its partitions while it had nothing to do ({'; '.join(why)}; limit "
            f"{self.timeout_s:g} s, KGSTREAM_INDEXER_REJOIN_TIMEOUT_S)"
        )


async def run_fetch_watch(
    stall: FetchStall,
    sample: Callable[[], Awaitable[Sample]],
    on_stalled: Callable[[str], None],
    first_record: Callable[[int, int], Awaitable[int | None]],
    interval_s: float = 2.0,
) -> None:
    """Every ``interval_s``, ``sample`` and observe it, asking ``first_record(partition,
    offset)`` (the first data record's offset at or after it, None when none) about suspects;
    once stalled, hand the reason to ``on_stalled`` (which ends the process) and return. A
    sample that fails (the broker unreachable) is skipped: it says nothing about the consumer."""
    failures: set[str] = set()
    first = True
    while True:
        await asyncio.sleep(interval_s)
        try:
            got = await sample()
        except Exception as exc:  # noqa: BLE001 - the next sample tries again
            # Once per kind: a consumer whose private state moved (a faust or aiokafka upgrade)
            # would otherwise turn the watch off without a word.
            level = logging.DEBUG if type(exc).__name__ in failures else logging.WARNING
            failures.add(type(exc).__name__)
            log.log(level, "fetch watch: sample failed: %s: %s", type(exc).__name__, exc)
            continue
        if first and got.positions:
            first = False
            log.info(
                "fetch watch: first sample: positions %s, end offsets %s, expected %s",
                dict(got.positions), dict(got.ends), dict(got.expected),
            )  # fmt: skip
        reason = stall.observe(
            member=got.member,
            busy=got.busy,
            positions=got.positions,
            ends=got.ends,
            expected=got.expected,
        )
        for suspect in [] if reason else stall.suspects:
            found = await first_record(suspect.partition, suspect.expected)
            log.info("fetch watch: %s; first record from %d: %s", suspect, suspect.expected, found)
            reason = stall.confirm(suspect, found)
        if reason is not None:
            on_stalled(reason)
            return


def read_offsets(app: object, topic: str, partitions: set[int]) -> dict[int, int | None]:
    """faust's read offset of each of ``partitions`` (None: unknown): the offset it seeked to
    when the partition was assigned, then the last record its fetch loop delivered."""
    read = app.consumer._read_offset  # type: ignore[attr-defined]
    return {p: read.get((topic, p)) for p in partitions}  # its TP is a (topic, partition) tuple


def expected_offsets(
    received: Mapping[int, int], read: Mapping[int, int | None]
) -> dict[int, int | None]:
    """The next offset the agent expects per partition: one past the last record it received,
    else one past faust's read offset (a seek target or a delivered record: the later of the
    two, so a fresh assignment is never suspected by one record)."""
    out: dict[int, int | None] = {}
    for partition, offset in read.items():
        if partition in received:
            out[partition] = received[partition]
        else:
            out[partition] = None if offset is None else offset + 1
    return out


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
