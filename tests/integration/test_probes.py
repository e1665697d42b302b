"""Health probes stay cheap and true under outages and load (issue 18, findings 10 and 13): a
frozen PostgreSQL makes the query API's /readyz answer 503 when its budget runs out (never a
hang that ends in 200), `kgstream status` end with an error when its budget runs out, and a
query flood that
holds every connection of the query pool does not hold /readyz, which has a connection of its
own. The test that stops PostgreSQL starts its own (tests/support/faults.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.manager import Endpoints
from services.core.infra.ports import free_port
from services.core.settings import Settings
from services.query_api.app import create_app
from services.retrieval.service import build_query_service
from tests.support.cli import kgstream
from tests.support.faults import (
    frozen,
    moved,
    own_postgres,
    postgres_pids,
    start_process,
    wait_until,
)
from tests.support.server import serve

pytestmark = pytest.mark.integration
# No wall-clock bounds: an answer that says its budget ran out ("did not answer", "no status
# from") is the budget working; a hang is what the client timeouts catch (status 0, or the
# CLI killed at 60 s), far above the budgets (0.8 s and 10 s) whatever the load.
HANG_S = 30.0


def timed_readyz(port: int) -> tuple[int, dict[str, Any], float]:
    """(status, body, seconds) of /readyz on ``port``; status 0 when nothing answered in
    HANG_S."""
    start = time.monotonic()
    try:
        resp = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=HANG_S)
    except httpx.TransportError:
        return 0, {}, time.monotonic() - start
    return resp.status_code, resp.json(), time.monotonic() - start


def timed_status(settings: Settings) -> tuple[int, str, float]:
    """(exit code, stderr, seconds) of `kgstream status`."""
    start = time.monotonic()
    done = kgstream(settings, "status", timeout=60)
    return done.returncode, done.stderr, time.monotonic() - start


def test_a_frozen_postgres_is_reported_at_once(settings: Settings, tmp_path: Path) -> None:
    with own_postgres(tmp_path / "pg") as pg:
        own = moved(settings, database_url=pg.url)
        port, probe_port = free_port(), free_port()
        env = {"KGSTREAM_API_PORT": str(port), "KGSTREAM_API_PROBE_PORT": str(probe_port)}
        api = start_process(own, tmp_path / "api.log", "worker", "query-api", env=env)
        try:
            assert wait_until(lambda: timed_readyz(port)[0] == 200, 90), api.output()[-3000:]
            assert timed_readyz(probe_port)[0] == 200  # the probes' own port (same answers)
            with frozen(postgres_pids(pg)):
                answers = [timed_readyz(p) for p in (port, probe_port, port)]
                code, stderr, took = timed_status(own)
            for status, body, _ in answers:
                assert status == 503, answers
                assert "the database did not answer" in body["detail"], answers
            assert code == 1, (took, stderr)
            assert "no status from" in stderr, stderr
            assert wait_until(lambda: timed_readyz(port)[0] == 200, 30), api.output()[-3000:]

            # Only the postmaster stopped: new connections hang, existing ones still work.
            with frozen(postgres_pids(pg, backends=False)):
                code, stderr, took = timed_status(own)
            assert code == 1, (took, stderr)
            assert "no status from" in stderr, stderr
            assert api.alive()
        finally:
            api.stop()


async def test_readiness_has_a_connection_of_its_own(
    settings: Settings,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    url = str(settings.database_url)
    # A budget for a cold engine's first check on a loaded machine: the budget is not under test.
    cold = moved(settings, readiness_budget_s=30.0)
    engine = make_engine(url, pool_size=2)  # and 5 more on overflow
    service = build_query_service(cold, engine, embedder, extractor, cpu_pool)
    app = create_app(cold, Endpoints(url, str(settings.kafka_bootstrap_servers)), service)
    held = [await engine.connect() for _ in range(7)]  # a query flood holds the whole pool
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            resp = await asyncio.wait_for(client.get("/readyz"), 60)  # above the budget: a hang
        assert resp.status_code == 200, resp.text
        assert resp.json()["status"] == "ready"
    finally:
        for conn in held:
            await conn.close()
        await engine.dispose()
        if hasattr(app.state, "readiness"):  # absent before issue 18
            await asyncio.to_thread(app.state.readiness.close)


def test_a_blocked_main_loop_fails_the_probes_port(
    settings: Settings,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    """Failed before: /healthz and /readyz on the probes port were answered from the readiness
    thread alone, so a blocked main loop (a dead replica) stayed live and ready."""
    url = str(settings.database_url)
    probe_port = free_port()
    tuned = settings.model_copy(update={"api_probe_port": probe_port, "api_loop_stall_s": 1.5})
    engine = make_engine(url)
    service = build_query_service(tuned, engine, embedder, extractor, cpu_pool)
    app = create_app(tuned, Endpoints(url, str(settings.kafka_bootstrap_servers)), service)

    release = threading.Event()

    async def block() -> dict[str, str]:
        # The point: a call that blocks the main loop, here until the test has seen the probes
        # fail (60 s at most).
        release.wait(60)
        return {"status": "unblocked"}

    app.add_api_route("/block", block)
    probes = f"http://127.0.0.1:{probe_port}"
    with serve(app) as api, ThreadPoolExecutor(1) as pool:
        assert httpx.get(f"{probes}/healthz", timeout=5).status_code == 200
        blocked = pool.submit(httpx.get, f"{api}/block", timeout=30)
        try:
            seen = wait_until(
                lambda: httpx.get(f"{probes}/healthz", timeout=5).status_code == 503, timeout=30
            )
            assert seen, "/healthz stayed 200 while the main loop was blocked"
            readyz = httpx.get(f"{probes}/readyz", timeout=5)
            assert readyz.status_code == 503
            assert "KGSTREAM_API_LOOP_STALL_S" in readyz.json()["detail"]
        finally:
            release.set()
        assert blocked.result().status_code == 200
        ok = wait_until(
            lambda: httpx.get(f"{probes}/healthz", timeout=5).status_code == 200, timeout=30
        )
        assert ok, "/healthz did not recover once the loop ran again"
