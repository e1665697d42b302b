"""What the faust/aiokafka consumer is doing, for the log line the rejoin watchdog writes before
it ends the process: the group coordinator's generation, member id and pending rejoin or error,
and where each task of the consumer's thread is waiting. Read from private attributes, best
effort: any of them missing says so instead of failing."""

from __future__ import annotations

import asyncio
from typing import Any


def describe(app: Any) -> str:
    """One line (never raises); call it on the app's event loop."""
    try:
        thread = app.consumer._thread
        consumer = thread._consumer
        coordinator = consumer._coordinator
        parts = [
            f"generation={coordinator.generation}",
            f"member_id={coordinator.member_id!r}",
            f"coordinator_id={coordinator.coordinator_id}",
            f"rejoin_needed={coordinator._rejoin_needed_fut.done()}",
            f"pending_error={coordinator._pending_exception!r}",
            f"coordination_done={coordinator._coordination_task.done()}",
            f"assignment={sorted(str(tp) for tp in consumer.assignment())}",
            f"flow_active={app.consumer.flow_active}",
            f"thread_tasks=[{_tasks(thread.thread_loop)}]",
            f"rebalance_tasks=[{_tasks(asyncio.get_running_loop(), 'partitions')}]",
        ]
    except Exception as exc:  # noqa: BLE001 - a diagnostic must not fail the exit
        return f"consumer state unavailable ({type(exc).__name__}: {exc})"
    return " ".join(parts)


def _tasks(loop: asyncio.AbstractEventLoop, containing: str = "") -> str:
    """Each pending task of ``loop`` (whose chain mentions ``containing``): the chain of
    coroutines it is awaiting, outermost first."""
    chains = (_chain(task.get_coro()) for task in list(asyncio.all_tasks(loop)))
    return "; ".join(sorted(c for c in chains if containing in c))


def _chain(coro: Any) -> str:
    links: list[str] = []
    while coro is not None and len(links) < 30:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            links.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " > ".join(links) or "?"
