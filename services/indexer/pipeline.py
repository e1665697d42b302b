"""Two stages over a stream of batches: the compute phase of batch N+1 overlaps the write phase
of batch N. No faust here: the agent (app.py) passes the batches and the two phases.

Guarantees, whatever fails or is cancelled:
- writes run one batch at a time, in arrival order (the write of N+1 starts after the write
  of N returned), so acks done at the end of ``write`` are in offset order per partition;
- at most one batch is prepared ahead of the one being written (the compute of N+2 starts
  only after the write of N returned): a prepared batch plans against state at most one
  batch old, which the write phase re-checks;
- a stop (cancellation) cancels the write in flight and drops the prepared batch: neither is
  acked, both are redelivered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

B = TypeVar("B")
P = TypeVar("P")


async def run_pipelined(
    batches: AsyncIterable[B],
    prepare: Callable[[B], Awaitable[P]],
    write: Callable[[B, P], Coroutine[Any, Any, None]],
) -> None:
    """``prepare`` each batch, then ``write`` it, overlapping ``prepare`` of the next batch
    with ``write`` of this one. Returns when ``batches`` ends and the last write is done; an
    exception from ``write`` surfaces at the next hand-over (or the end)."""
    writing: asyncio.Task[None] | None = None
    try:
        async for batch in batches:
            prepared = await prepare(batch)
            if writing is not None:
                await writing  # the previous batch is written (and acked) before this one
            writing = asyncio.create_task(write(batch, prepared))
        if writing is not None:
            await writing
    finally:
        if writing is not None and not writing.done():
            writing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writing
