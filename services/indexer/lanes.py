"""Background lanes for large documents (issue 18, finding 14). No faust here: the agent
(app.py) passes its events and says how to handle a lane's batch.

The agent reads one ordered stream of events from all its partitions. A document of hundreds
of chunks is minutes of CPU on a small machine; computed inside the agent's batch, it held
every partition behind it. Instead, the agent hands its partition to a lane: a task that works
through that partition's events in offset order, the large document first (computed in slices,
services/indexer/compute.py, so the agent's batches take turns with it on the CPU), while the
agent goes on with the other partitions.

Order and acks, per partition:
- while a lane holds a partition, every event of it the agent receives joins the lane's queue;
  the lane handles and acks them in offset order, the agent none of them;
- a lane starts only after the agent has written (and acked) the events of its partition that
  came before the large document in the same batch (``start``, called by the agent then);
- a lane lets its partition go when its queue is empty, with no await between that check and
  the release, so whatever the agent receives afterwards comes after all the lane handled.

So no offset is ever acked before an earlier one of its partition. That matters beyond order:
faust commits the highest contiguous acked offset, but its check misses a gap of one message
at the head (faust-streaming 0.15 ``Consumer._new_offset``: committed 10, acked 11 and 12,
commits 13), so acking out of order could commit past an event not yet applied.

A rebalance does not stop the agent (and ``stream_wait_empty`` is off), so on revocation the
lanes of the revoked partitions are cancelled and their queues dropped (``revoke``): nothing
of them is acked, so whoever owns the partition next, this process included, reads them again
from the committed offset. Until the partition is assigned again, and for events fetched
before the rebalance (``current`` says which are not), ``divert`` drops its events too: handled
by the agent, they would be applied, and acked, ahead of the dropped ones.

A lane that fails keeps its partition held (nothing of it is handled after the failure), logs
the failure and calls ``on_failure`` (the indexer ends the process: a restarted agent would
start with no lanes and apply later events of their partitions first); the agent also raises
it at its next batch. The events waiting in lanes are bounded by ``held_limit_bytes``; past it
the agent waits for the lanes, as it waited for every large document before."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

E = TypeVar("E")
log = logging.getLogger(__name__)

HELD_LIMIT_BYTES = 64 * 1024 * 1024
"""Bytes of events (their values) that may wait in lanes before the agent waits for them."""


class Lanes(Generic[E]):
    """The partitions held by a large document, each with its queue of events and its task."""

    def __init__(
        self,
        handle: Callable[[list[E]], Awaitable[None]],
        *,
        partition: Callable[[E], Hashable],
        size: Callable[[E], int],
        batch_size: int,
        held_limit_bytes: int = HELD_LIMIT_BYTES,
        current: Callable[[E], bool] = lambda _: True,
        on_failure: Callable[[BaseException], None] = lambda _: None,
    ) -> None:
        """``handle`` applies and acks a lane's batch (at most ``batch_size`` events of one
        partition, in order); ``partition`` and ``size`` (bytes) describe an event;
        ``current`` is False for an event fetched before the last rebalance; ``on_failure``
        is told of a lane's failure."""
        self._handle = handle
        self._partition = partition
        self._size = size
        self._batch_size = batch_size
        self._limit = held_limit_bytes
        self._current = current
        self._on_failure = on_failure
        self._queues: dict[Hashable, deque[E]] = {}
        self._tasks: dict[Hashable, asyncio.Task[None]] = {}
        self._bytes: dict[Hashable, int] = {}  # per held partition, its in-flight batch included
        self._revoked: set[Hashable] = set()
        self._changed = asyncio.Event()
        self._failure: Exception | None = None

    def held(self) -> set[Hashable]:
        """The partitions a lane holds now."""
        return set(self._queues)

    def divert(self, events: Sequence[E]) -> list[E]:
        """The events the agent may handle; those of held partitions join their lane's queue,
        those of revoked partitions or from before the last rebalance are dropped (unacked, so
        read again). Raises a lane's failure."""
        self.check()
        free: list[E] = []
        for event in self._live(events):
            key = self._partition(event)
            queue = self._queues.get(key)
            if queue is None:
                free.append(event)
            else:
                queue.append(event)
                self._bytes[key] += self._size(event)
        return free

    def hold(self, events: Iterable[E]) -> None:
        """Hold the partitions of ``events`` (in offset order: per partition, its large
        document and the events after it) from now on; their lanes run from ``start``.
        Events ``divert`` would drop are left out."""
        for event in self._live(events):
            key = self._partition(event)
            self._queues.setdefault(key, deque()).append(event)
            self._bytes[key] = self._bytes.get(key, 0) + self._size(event)

    async def revoke(self, partitions: Iterable[Hashable]) -> None:
        """The partitions are no longer ours: cancel their lanes and drop their queues (none
        of it was acked); drop their events until they are assigned again."""
        keys = set(partitions)
        self._revoked |= keys
        tasks = [self._tasks.pop(key) for key in keys if key in self._tasks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for key in keys:
            self._queues.pop(key, None)
            self._bytes.pop(key, None)
        self._changed.set()

    def assign(self, partitions: Iterable[Hashable]) -> None:
        """The partitions are ours (again): their events, fetched from now on, are handled."""
        self._revoked -= set(partitions)

    def start(self, partitions: Iterable[Hashable]) -> None:
        """Start the lanes of ``partitions``: the agent has written their earlier events."""
        for key in partitions:
            if key in self._queues and key not in self._tasks:
                log.info("a large document holds %s: its lane computes it in the background", key)
                self._tasks[key] = asyncio.create_task(self._run(key), name=f"lane {key}")

    async def room(self) -> None:
        """Wait while the events held in lanes are over the limit. Raises a lane's failure."""
        while sum(self._bytes.values()) > self._limit:
            self.check()
            self._changed.clear()
            await self._changed.wait()
        self.check()

    def check(self) -> None:
        """Raise the first failure of a lane, if any."""
        if self._failure is not None:
            raise self._failure

    async def close(self) -> None:
        """Cancel every lane: what they had not acked is redelivered."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _live(self, events: Iterable[E]) -> list[E]:
        return [e for e in events if self._partition(e) not in self._revoked and self._current(e)]

    async def _run(self, key: Hashable) -> None:
        queue = self._queues[key]
        try:
            while queue:
                batch = [queue.popleft() for _ in range(min(self._batch_size, len(queue)))]
                await self._handle(batch)
                self._bytes[key] -= sum(self._size(e) for e in batch)
                self._changed.set()
        except Exception as exc:
            log.exception("the lane of partition %s failed", key)
            self._failure = self._failure or exc
            self._changed.set()
            self._on_failure(exc)
            return
        # No await since the queue was seen empty.
        del self._queues[key], self._tasks[key], self._bytes[key]
