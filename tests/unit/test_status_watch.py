"""`kgstream status --watch`'s loop: it stops at the stop event, after the read under way."""

from __future__ import annotations

import asyncio
import io
from typing import Any

from services.cli.status_view import watch


def test_stop_during_a_read_ends_the_loop_after_that_read() -> None:
    stop = asyncio.Event()
    reads = 0

    async def read() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        if reads == 2:
            stop.set()  # Ctrl-C arrives while the second read is under way
        await asyncio.sleep(0)
        return {"reads": reads}

    out = io.StringIO()
    asyncio.run(asyncio.wait_for(watch(read, interval_s=0.01, as_json=True, out=out, stop=stop), 5))
    assert reads == 2
    assert out.getvalue().splitlines() == ['{"reads": 1}', '{"reads": 2}']


def test_a_long_interval_does_not_delay_the_stop() -> None:
    stop = asyncio.Event()

    async def read() -> dict[str, Any]:
        asyncio.get_running_loop().call_later(0.05, stop.set)
        return {}

    out = io.StringIO()
    asyncio.run(asyncio.wait_for(watch(read, interval_s=3600, as_json=True, out=out, stop=stop), 5))
    assert out.getvalue() == "{}\n"
