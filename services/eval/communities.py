"""Whether global mode can be evaluated: it needs the community engine (services/communities,
issue 4) to publish a snapshot. When the engine is not installed, global mode is reported
unavailable instead of being faked."""

from __future__ import annotations

import logging

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.settings import Settings

log = logging.getLogger(__name__)


async def published_snapshot(engine: AsyncEngine) -> tuple[int | None, int]:
    """(id of the published snapshot, its community count)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT s.id, (SELECT count(*) FROM communities c WHERE c.snapshot_id = s.id)"
                    " FROM snapshots s WHERE s.status = 'published'"
                )
            )
        ).first()
    return (None, 0) if row is None else (int(row[0]), int(row[1]))


async def build_snapshot(settings: Settings, database_url: str) -> str | None:
    """Run one recompute of the community engine; None on success, else why global mode is
    unavailable."""
    try:
        from services.communities.app import build_deps  # noqa: PLC0415 - optional engine
        from services.communities.recompute import recompute  # noqa: PLC0415
    except ImportError as exc:
        return f"the community engine is not installed ({exc})"
    deps = build_deps(settings, database_url)
    try:
        await recompute(deps, "requested")
    finally:
        await deps.engine.dispose()
    return None


async def ensure_snapshot(engine: AsyncEngine, settings: Settings, database_url: str) -> str | None:
    """A published snapshot with communities exists (built now if needed); else the reason."""
    snapshot, communities = await published_snapshot(engine)
    if snapshot is None:
        reason = await build_snapshot(settings, database_url)
        if reason is not None:
            return reason
        snapshot, communities = await published_snapshot(engine)
    if snapshot is None:
        return "the community engine ran but published no snapshot"
    if communities == 0:
        return f"the published snapshot {snapshot} has no communities"
    return None
