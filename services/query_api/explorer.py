"""The graph explorer: ``GET /explorer`` (issue 34), a static page for people, open to anyone
who reaches the API (it holds no data). Everything it shows comes from the API's own routes
under the key the page is given (``/v1/entities``, ``/v1/entities/{id}/neighbourhood``,
``/v1/relationships/{id}``, ``/v1/query``, ``/v1/facts``, ``/v1/curations``), so it shows
only what that key may see; its assets are under ``/static`` (Cytoscape.js vendored under
static/vendor/cytoscape with its licence). docs/explorer.md describes it."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import FileResponse

from services.query_api.dashboard import STATIC

router = APIRouter()


@router.get("/explorer", include_in_schema=False)
async def explorer_page() -> FileResponse:
    """The page; it asks for an API key when a route answers 401."""
    return FileResponse(STATIC / "explorer.html", media_type="text/html")
