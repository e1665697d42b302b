"""Where the indexer's consumer resumes a partition: never above the group's own record of it
(services/indexer/topic_identity.py, ``resume_at``). faust seeks each assigned partition to the
broker's committed offset after a rebalance (``perform_seek``); a committed offset can belong to
a log the broker has since replaced, so the consumer then seeks lower where the database says
so. Private parts of faust 0.15 (``perform_seek``, ``_committed_offset``): faust-streaming is
pinned in pyproject.toml; re-check this before moving the pin."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import faust

log = logging.getLogger(__name__)

Resume = Callable[[dict[int, int | None]], Awaitable[dict[int, int]]]
"""Committed offsets of the assigned partitions -> those to read from lower, and where."""


def install(app: faust.App, topic: str, resume: Resume) -> None:
    """Make ``app``'s consumer (created when the worker starts; install after any other
    consumer class change) seek ``topic``'s partitions lower where ``resume`` says."""
    base = app.transport.Consumer

    class ResumingConsumer(base):  # type: ignore[misc,valid-type]
        async def perform_seek(self) -> None:
            await super().perform_seek()
            assigned = [tp for tp in self.assignment() if tp.topic == topic]
            if not assigned:
                return
            committed = {tp.partition: self._committed_offset.get(tp) for tp in assigned}
            lower = await resume(committed)
            for tp in assigned:
                if tp.partition in lower:
                    offset = lower[tp.partition]
                    log.warning(
                        "%s/%d resumes at offset %d, below the broker's committed %s: the "
                        "group's own record says the records from there on were not handled "
                        "(a replaced log, or a progress write that failed)",
                        tp.topic,
                        tp.partition,
                        offset,
                        committed[tp.partition],
                    )
                    await self.seek(tp, offset)
                    # faust commits only above what it believes committed.
                    self._committed_offset[tp] = offset or None

    app.transport.Consumer = ResumingConsumer  # type: ignore[misc]
