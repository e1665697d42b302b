"""The small HTTP server of a worker process (indexer, communities): ``/metrics`` (Prometheus
text format), ``/healthz`` (200 while the process runs and its liveness check, if any, finds
nothing wrong, else 503 with the reason) and ``/readyz`` (200 when connected to what it needs,
else 503 with the reason as JSON, within ``ready_budget_s`` even when the database hangs). Runs
on the process's event loop."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.registry import CollectorRegistry

from services.core.deadline import DeadlineExceeded, SingleFlight
from services.core.errors import ConfigurationError

Readiness = Callable[[], Awaitable[str | None]]
"""None when ready, else why not (a sentence for the 503 body)."""
Liveness = Callable[[], str | None]
"""None while the process is healthy, else why it should be restarted (for the 503 body)."""


class OpsServer:
    """Serves the three routes on ``host:port`` (port 0: any free port)."""

    def __init__(
        self,
        host: str,
        port: int,
        ready: Readiness,
        *,
        registry: CollectorRegistry = REGISTRY,
        live: Liveness | None = None,
        ready_budget_s: float = 0.8,
        ready_give_up_s: float = 5.0,
    ) -> None:
        self.host, self.port = host, port
        self._registry, self._live = registry, live
        # One readiness check at a time, answered within the budget (services/core/deadline.py).
        self._ready = SingleFlight(ready, ready_budget_s, ready_give_up_s, "the readiness check")
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Listen; returns the base URL (``http://host:port``) with the port actually bound."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise ConfigurationError(
                f"cannot serve metrics on {self.host}:{self.port}: {exc.strerror}. Another "
                "process has the port: set this process's KGSTREAM_*_METRICS_PORT (0 = any "
                "free port, listed by `kgstream status`)"
            ) from exc
        self.port = int(sock.getsockname()[1])
        await web.SockSite(self._runner, sock).start()
        return f"http://{url_host(self.host)}:{self.port}"

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        reason = self._live() if self._live is not None else None
        if reason is None:
            return web.json_response({"status": "ok"})
        return web.json_response({"status": "unhealthy", "reason": reason}, status=503)

    async def _readyz(self, _: web.Request) -> web.Response:
        try:
            reason = await self._ready()
        except DeadlineExceeded as exc:
            reason = f"{exc} (the database or the broker does not answer)"
        except Exception as exc:  # noqa: BLE001 - readiness reports any failure
            reason = f"{type(exc).__name__}: {exc}"[:300]
        if reason is None:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "unavailable", "reason": reason}, status=503)


def url_host(bind: str) -> str:
    """The host to put in a URL for a server bound to ``bind`` (a wildcard: this machine)."""
    if bind in ("0.0.0.0", "::", ""):  # noqa: S104 - naming the wildcard, not binding it
        return socket.gethostname()
    return f"[{bind}]" if ":" in bind else bind
