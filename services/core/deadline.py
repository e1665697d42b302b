"""Answers within a time budget even when what they wait on hangs (a stopped PostgreSQL, a
frozen broker). ``asyncio.wait_for`` is not enough: on timeout it waits for the cancelled work
to finish, and psycopg's cancellation of a query on a server that does not answer itself waits
up to ten seconds. Here the caller gets its answer at the deadline and the abandoned work ends
on its own (issue 18, findings 10 and 13)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from contextlib import suppress
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class DeadlineExceeded(TimeoutError):
    """The work did not finish within its budget; ``waited_s`` is how long it has been running."""

    def __init__(self, what: str, waited_s: float) -> None:
        super().__init__(f"{what} did not answer within {waited_s:.1f} s")
        self.waited_s = waited_s


def run_within(work: Callable[[], Coroutine[Any, Any, T]], timeout_s: float, what: str) -> T:
    """Blocking: run ``work()`` on an event loop of its own in a daemon thread and return its
    result, or raise DeadlineExceeded after ``timeout_s``; the thread is left to end (or to be
    dropped at exit) so a one-shot command can answer and exit."""
    result: Future[T] = Future()

    def run() -> None:
        try:
            result.set_result(asyncio.run(work()))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            result.set_exception(exc)

    threading.Thread(target=run, name="kgstream-deadline", daemon=True).start()
    try:
        return result.result(timeout=timeout_s)
    except TimeoutError:
        raise DeadlineExceeded(what, timeout_s) from None


class SingleFlight(Generic[T]):
    """One ``check()`` in flight at a time, each caller answered within ``budget_s``: a caller
    that finds a check already running waits only for what is left of the budget counted from
    that check's start, so a hung check is reported at once instead of piling more up behind it.
    A check running longer than ``give_up_s`` is cancelled (a dead connection), so a later
    caller starts a new one."""

    def __init__(
        self, check: Callable[[], Awaitable[T]], budget_s: float, give_up_s: float, what: str
    ) -> None:
        self._check, self.budget_s, self._give_up_s, self._what = check, budget_s, give_up_s, what
        self._task: asyncio.Future[T] | None = None
        self._started = 0.0

    async def __call__(self) -> T:
        """The result of the current or a new check; DeadlineExceeded past the budget."""
        now = time.monotonic()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._check())
            self._task.add_done_callback(_consume)
            self._started = now
        age = now - self._started
        if age > self._give_up_s:
            self._task.cancel()
        done, _ = await asyncio.wait({self._task}, timeout=max(0.0, self.budget_s - age))
        if not done or self._task.cancelled():  # cancelled: given up on above
            raise DeadlineExceeded(self._what, time.monotonic() - self._started)
        return self._task.result()


class LoopStopped(RuntimeError):
    """Work was submitted to a BackgroundLoop after ``stop``."""


class BackgroundLoop:
    """An event loop in a daemon thread of its own, for work that must not wait behind the
    process's main loop (readiness under query load). Started on first use; once stopped it
    stays stopped (a late caller must not start a new thread and new connections)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def submit(self, work: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``work`` on the background loop (thread-safe); LoopStopped after stop."""
        try:
            loop = self._running()
        except LoopStopped:
            work.close()
            raise
        return asyncio.run_coroutine_threadsafe(work, loop)

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Await ``work`` run on the background loop; cancelling the caller cancels it."""
        return await asyncio.wrap_future(self.submit(work))

    def stop(
        self, final: Coroutine[Any, Any, object] | None = None, timeout_s: float = 5.0
    ) -> None:
        """Run ``final`` there (clean-up, bounded by ``timeout_s``), then stop the loop."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            self._stopped = True
        if loop is None or thread is None:
            if final is not None:
                final.close()
            return
        if final is not None:
            with suppress(Exception):
                asyncio.run_coroutine_threadsafe(final, loop).result(timeout_s)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        if not thread.is_alive():  # else a hung callback holds it: left to the daemon thread
            loop.close()

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._stopped:
                raise LoopStopped(f"{self._name} is stopped")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop


def _consume(task: asyncio.Future[Any]) -> None:
    # An abandoned check's failure was already reported as a timeout: read it so asyncio does
    # not log "exception was never retrieved".
    if not task.cancelled():
        task.exception()
