"""The communities worker's process pool (Leiden holds the GIL, so it runs in a process of
its own). A pool process blocks on its call queue forever once its parent is gone: a worker
killed with SIGKILL would leave it running, one more after every restart. Each pool process
therefore watches its parent and exits when the parent changes."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor

PARENT_POLL_S = 1.0


def make_pool() -> ProcessPoolExecutor:
    """One spawned process that does not outlive the process that made it."""
    return ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=exit_with_parent,
        initargs=(os.getpid(),),
    )


def exit_with_parent(parent: int) -> None:
    """Pool initializer: exit at once when ``parent`` is no longer this process's parent."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)  # nothing to flush: the parent that wanted the results is gone

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
