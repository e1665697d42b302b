"""A real uvicorn server for one app, in a thread of the test process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI


@contextmanager
def serving(app: FastAPI, port: int, host: str = "127.0.0.1") -> Iterator[None]:
    """Serve ``app`` on host:port until the block ends."""
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, f"the API did not start on {host}:{port}"
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=30)
