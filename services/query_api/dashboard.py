"""The built-in dashboard: ``GET /dashboard`` (a static page, open to anyone who reaches the
API: it holds no data), its data at ``GET /v1/dashboard`` (the same ``admin`` scope as
/v1/status), and the page's assets under ``/static`` (served from the installed package;
uPlot is vendored under static/vendor/uplot with its licence, nothing comes from the internet).

The data joins the database's history (services/core/history.py) with this process's sampler
(services/query_api/sampler.py) for lag, change ratio and query latency."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.change_state import read_change_state
from services.core.history import history
from services.core.indexer_health import OffsetReader, read_progress
from services.core.series import points
from services.core.settings import Settings
from services.query_api.auth import ADMIN
from services.query_api.sampler import Probe, Sampler

STATIC = Path(__file__).resolve().parent / "static"
STEP_S = 60.0  # the database history's bucket

router = APIRouter()


def make_probe(engine: AsyncEngine, offsets: OffsetReader) -> Any:
    """The sampler's probe: lag per consumer group from indexer_progress against the broker's
    end offsets (approximate on the embedded tansu), and the change ratio."""

    async def probe() -> Probe:
        async with engine.connect() as conn:
            ratio = (await read_change_state(conn)).ratio
            progress = await read_progress(conn)
        ends = await asyncio.to_thread(offsets.read, [(p.topic, p.partition) for p in progress])
        lag: dict[str, int | None] = {}
        for p in progress:  # a group's lag is unknown when any of its partitions' is
            end = ends.get((p.topic, p.partition))
            part = None if end is None else max(0, end - p.next_offset)
            before = lag.get(p.consumer_group, 0)
            lag[p.consumer_group] = None if part is None or before is None else before + part
        return Probe(lag, ratio)

    return probe


@asynccontextmanager
async def sampling(app: FastAPI) -> AsyncIterator[None]:
    """Run the sampler ``install`` put on the app for the app's lifetime (its lifespan)."""
    sampler: Sampler = app.state.sampler
    task = asyncio.create_task(sampler.run(), name="kgstream-dashboard-sampler")
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task
        await asyncio.to_thread(app.state.offsets.close)


@router.get("/dashboard", include_in_schema=False)
async def dashboard_page() -> FileResponse:
    """The page; it fetches /v1/dashboard and asks for an API key when that answers 401."""
    return FileResponse(STATIC / "dashboard.html", media_type="text/html")


@router.get("/v1/dashboard", tags=["operations"], dependencies=[ADMIN])
async def dashboard_data(request: Request) -> dict[str, Any]:
    """Time series for /dashboard: ``charts`` maps a name to ``{unit, t, series: [{name,
    values}], points}`` (``t`` in seconds since the epoch, one value per ``t`` and series,
    null for a gap); ``snapshots`` also carries its ``rows``."""
    settings: Settings = request.app.state.settings
    sampler: Sampler = request.app.state.sampler
    engine: AsyncEngine = request.app.state.service.engine
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="REPEATABLE READ")
        async with conn.begin():
            db = await history(conn, settings.dashboard_window_s, STEP_S)
    charts: dict[str, dict[str, Any]] = {
        name: db[name]
        for name in ("throughput", "freshness", "dead_letters", "tokens", "snapshots")
    }
    charts.update(sampler.charts(settings.recompute_threshold))
    for c in charts.values():
        c["points"] = points(c)
    return {
        "now": db["now"],
        "window_s": settings.dashboard_window_s,
        "step_s": STEP_S,
        "sample_s": settings.dashboard_sample_s,
        "refresh_s": settings.dashboard_refresh_s,
        "threshold": settings.recompute_threshold,
        "charts": charts,
    }


def install(app: FastAPI, settings: Settings, engine: AsyncEngine, bootstrap: str) -> None:
    """The page, its data route, the static assets, and the process's sampler (which samples
    while ``sampling`` runs, in the app's lifespan)."""
    app.state.offsets = OffsetReader(bootstrap)
    app.state.sampler = Sampler(
        make_probe(engine, app.state.offsets),
        interval_s=settings.dashboard_sample_s,
        window_s=settings.dashboard_window_s,
    )
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
