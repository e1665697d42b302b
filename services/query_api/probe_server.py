"""/healthz and /readyz of the query API on a port of their own (KGSTREAM_API_PROBE_PORT),
served from the readiness thread's event loop: probes that never wait behind queries, even when
a flood saturates the API's own event loop (issue 18, finding 13). The answers are those of the
API's port (readiness.py)."""

from __future__ import annotations

from aiohttp import web

from services.core.errors import ConfigurationError
from services.core.telemetry.server import url_host
from services.query_api.readiness import Readiness


class ProbeServer:
    """Started and stopped from the API's lifespan (blocking calls: run them in a thread)."""

    def __init__(self, readiness: Readiness, host: str, port: int) -> None:
        self._readiness, self.host, self.port = readiness, host, port
        self._runner: web.AppRunner | None = None

    def start(self) -> str:
        """Listen; returns the base URL."""
        url: str = self._readiness.on_loop(self._start()).result(10)
        return url

    def stop(self) -> None:
        """Stop listening (idempotent)."""
        if self._runner is not None:
            self._readiness.on_loop(self._runner.cleanup()).result(10)
            self._runner = None

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigurationError(
                f"cannot serve probes on {self.host}:{self.port}: {exc.strerror}: set "
                "KGSTREAM_API_PROBE_PORT to a free port"
            ) from exc
        self._runner = runner
        return f"http://{url_host(self.host)}:{self.port}"

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, _: web.Request) -> web.Response:
        code, body = await self._readiness.answer_here()
        return web.json_response(body, status=code)
