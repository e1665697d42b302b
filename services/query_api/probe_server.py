"""/healthz and /readyz of the query API on a port of their own (KGSTREAM_API_PROBE_PORT),
served from the readiness thread's event loop: probes that never wait behind queries, even when
a flood saturates the API's own event loop (issue 18, finding 13). The answers are those of the
API's port (readiness.py), except that both fail while the API's main event loop is stalled
(heartbeat.py): this thread would otherwise keep answering for a dead replica."""

from __future__ import annotations

from aiohttp import web

from services.core.errors import ConfigurationError
from services.core.telemetry.server import url_host
from services.query_api.heartbeat import Heartbeat
from services.query_api.readiness import Readiness


class ProbeServer:
    """Started and stopped from the API's lifespan (blocking calls: run them in a thread)."""

    def __init__(self, readiness: Readiness, heartbeat: Heartbeat, host: str, port: int) -> None:
        self._readiness, self._heartbeat, self.host, self.port = readiness, heartbeat, host, port
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
        stalled = self._stalled()
        if stalled is not None:
            return stalled
        return web.json_response({"status": "ok"})

    async def _readyz(self, _: web.Request) -> web.Response:
        stalled = self._stalled()
        if stalled is not None:
            return stalled
        code, body = await self._readiness.answer_here()
        return web.json_response(body, status=code)

    def _stalled(self) -> web.Response | None:
        age = self._heartbeat.stalled_for()
        if age is None:
            return None
        detail = (
            f"the API's event loop has not run for {age:.0f} s "
            f"(limit {self._heartbeat.stall_s:g} s, KGSTREAM_API_LOOP_STALL_S)"
        )
        return web.json_response({"status": "stalled", "detail": detail}, status=503)
