"""The query API under a real uvicorn server in a background thread (its own event loop)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import uvicorn

from services.core.infra.ports import free_port


@contextmanager
def serving(
    app: Any, port: int, host: str = "127.0.0.1", lifespan: Literal["on", "off"] = "on"
) -> Iterator[str]:
    """Serve ``app`` on host:port until the block ends; yields its base URL. The app's engine
    must not have been used from another event loop (build it just for this server)."""
    config = uvicorn.Config(app, host=host, port=port, lifespan=lifespan, log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the API server did not start on {host}:{port}")
        time.sleep(0.05)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@contextmanager
def serve(app: Any, lifespan: Literal["on", "off"] = "on") -> Iterator[str]:
    """Serve ``app`` on a free loopback port; yields its base URL."""
    with serving(app, free_port(), lifespan=lifespan) as url:
        yield url
