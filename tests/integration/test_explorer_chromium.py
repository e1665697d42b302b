"""/explorer (issue 34) in Debian's headless Chromium, driven over the DevTools protocol
(tests/support/cdp.py), against a running query API with keys required and the indexed sample,
one of whose documents only the ``red`` group may read:

- an entity's neighbourhood draws the nodes and edges the neighbourhood route gives that key,
  and clicking a relationship shows its evidence;
- a question draws the hops its answer used;
- a merge made from the page is a curation `kgstream curate list` shows, made by that key;
- a key without ``red`` never sees the red-only document's entity, alone or as a neighbour,
  and gets no curation controls.

A screenshot per view is saved under the test's tmp_path (and under
$KGSTREAM_SCREENSHOT_DIR when set: docs/explorer.md's images come from there)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import text

from services.core.api_keys import create_key
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.settings import Settings
from services.query_api.dashboard import STATIC
from tests.integration.test_status_dashboard import running_api
from tests.support.cdp import Page, browser
from tests.support.cli import kgstream
from tests.support.query_fixtures import clone_database
from tests.support.tools import require_tool

pytestmark = pytest.mark.integration
KEY = "kgstream.apiKey"
READY = "document.body.dataset.state === 'ready' || document.body.dataset.state === 'error'"


@dataclass(frozen=True)
class World:
    """The sample with one document red-only, and the names the views are about."""

    url: str
    hub: str  # an entity with many relationships, in documents everyone reads
    red: str  # an entity only the red-only document mentions
    beside_red: str  # a neighbour of it that others mention too
    question: str  # a question whose answer follows relationships
    merged: tuple[str, str]  # two entities the page merges (names most alike)


_RED_ENTITY = text(
    "SELECT e.name, min(m.doc_id), (SELECT o.name FROM relationships r JOIN entities o"
    "  ON o.id = CASE WHEN r.source_id = e.id THEN r.target_id ELSE r.source_id END"
    "  WHERE (r.source_id = e.id OR r.target_id = e.id) AND o.mention_count > 3"
    "  ORDER BY r.weight DESC, r.id LIMIT 1)"
    " FROM entities e JOIN mentions m ON m.entity_id = e.id GROUP BY e.id, e.name"
    " HAVING count(DISTINCT m.doc_id) = 1 AND count(*) >= 2 ORDER BY e.id"
)
# Two entities of one type whose names are most alike: what a curator merges.
_ALIKE = text(
    "SELECT a.name, b.name FROM entities a JOIN entities b ON a.id < b.id AND a.type = b.type"
    " WHERE similarity(a.name, b.name) >= 0.4 ORDER BY similarity(a.name, b.name) DESC, a.id"
    " LIMIT 1"
)
_HUBS = text(
    "SELECT e.name FROM entities e JOIN relationships r ON e.id IN (r.source_id, r.target_id)"
    " WHERE NOT EXISTS (SELECT 1 FROM mentions m WHERE m.entity_id = e.id AND m.doc_id = :d)"
    " GROUP BY e.id, e.name ORDER BY count(*) DESC, e.id LIMIT 4"
)


@pytest.fixture(scope="module")
async def world(sample_db: str) -> World:
    url = clone_database(sample_db, sample_db.rsplit("/", 1)[1])
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            red, doc, beside = next(r for r in (await conn.execute(_RED_ENTITY)).all() if r[2])
            await conn.execute(
                text("UPDATE documents SET acl = '{red}' WHERE doc_id = :d"), {"d": doc}
            )
            hubs = [str(r[0]) for r in (await conn.execute(_HUBS, {"d": doc})).all()]
            keep, other = (await conn.execute(_ALIKE)).one()
    finally:
        await engine.dispose()
    question = f"How is {hubs[0]} connected to {hubs[1]}?"
    return World(url, hubs[0], str(red), str(beside), question, (str(keep), str(other)))


@pytest.fixture(scope="module")
async def keys(world: World) -> dict[str, str]:
    engine = make_engine(world.url)
    try:
        admin = (await create_key(engine, ["admin"], name="explorer-admin"))[1]
        outsider = (await create_key(engine, ["query"], groups=["blue"], name="outsider"))[1]
    finally:
        await engine.dispose()
    return {"admin": admin, "outsider": outsider}


@pytest.fixture
def api(
    world: World,
    settings: Settings,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> Iterator[tuple[str, Settings]]:
    on = settings.model_copy(update={"database_url": world.url, "auth": "required"})
    with running_api(on, embedder, extractor, cpu_pool) as url:
        yield url, on


def shots(tmp: Path) -> list[Path]:
    """Where a view's screenshot goes: the test's tmp_path, and $KGSTREAM_SCREENSHOT_DIR."""
    out = os.environ.get("KGSTREAM_SCREENSHOT_DIR")
    return [tmp, *([Path(out)] if out else [])]


def snap(page: Page, tmp: Path, name: str) -> Path:
    shot = page.screenshot(tmp / name)
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank one
    for place in shots(tmp)[1:]:
        place.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, place / name)
    return shot


def as_key(page: Page, base: str, key: str) -> None:
    page.goto(f"{base}/explorer")
    page.evaluate(f"sessionStorage.setItem({json.dumps(KEY)}, {json.dumps(key)})")


def open_view(page: Page, base: str, query: str) -> dict[str, Any]:
    page.goto(f"{base}/explorer?{query}")
    page.wait_for(READY)
    state: dict[str, Any] = page.evaluate(
        "({state: document.body.dataset.state, status: document.getElementById('status')"
        ".textContent, nodes: Number(document.getElementById('graph').dataset.nodes),"
        " edges: Number(document.getElementById('graph').dataset.edges),"
        " names: window.explorer ? window.explorer.names : [],"
        " curation: !document.getElementById('curation').hidden})"
    )
    assert state["state"] == "ready", state
    return state


def api_get(base: str, key: str, path: str, **params: Any) -> Any:
    resp = httpx.get(f"{base}{path}", params=params, headers=_bearer(key), timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def admin_views(page: Page, base: str, world: World, key: str, tmp: Path) -> None:
    as_key(page, base, key)
    state = open_view(page, base, f"entity={quote(world.hub)}&hops=1")
    found = api_get(base, key, "/v1/entities", name=world.hub, limit=1)["entities"][0]
    hood = api_get(base, key, f"/v1/entities/{found['id']}/neighbourhood", hops=1, limit=150)
    assert (state["nodes"], state["edges"]) == (len(hood["nodes"]), len(hood["edges"]))
    assert state["nodes"] > 3, state
    assert state["edges"] > 0, state
    assert state["curation"]  # an admin key curates
    snap(page, tmp, "explorer-entity.png")
    # a click on a relationship shows its evidence sentences
    edge = hood["edges"][0]
    page.evaluate(f"void window.kgExplorer.cy().$id('r{edge['id']}').emit('tap')")
    shown = page.wait_for("document.querySelectorAll('#details .evidence li').length")
    detail = api_get(base, key, f"/v1/relationships/{edge['id']}")
    assert shown == len(detail["evidence"]) > 0
    snap(page, tmp, "explorer-evidence.png")
    # a question draws the hops its answer used
    asked = httpx.post(
        f"{base}/v1/query",
        json={"question": world.question, "mode": "auto"},
        headers=_bearer(key),
        timeout=60,
    ).json()
    hops = len(asked["paths"]) + sum(len(r["hops"]) for r in asked["routes"])
    assert hops > 0, asked["notes"]
    state = open_view(page, base, f"q={quote(world.question)}")
    assert state["edges"] >= hops
    assert page.evaluate("document.querySelector('#answer .answer-text').textContent")
    snap(page, tmp, "explorer-answer.png")
    # a merge made on the page
    keep, other = world.merged
    open_view(page, base, f"entity={quote(keep)}")
    page.evaluate(
        "(() => {const f = (id, v) => { document.getElementById(id).value = v; };"
        f" f('curate-kind', 'merge'); f('curate-name', {json.dumps(keep)});"
        f" f('curate-other', {json.dumps(other)}); f('curate-reason', 'one name, two spellings');"
        " document.querySelector('#curate-form button[type=submit]').click(); })()"
    )
    said = page.wait_for("document.getElementById('curate-status').textContent")
    assert said.startswith("Rule #"), said
    page.wait_for("document.querySelectorAll('#curations li').length")
    page.evaluate("document.getElementById('curation').scrollIntoView()")
    snap(page, tmp, "explorer-curation.png")
    # the review sample as pairs to judge: the first judged "different" becomes a rule (or,
    # for the graph as it is, needs none), as `kgstream review apply` does
    page.evaluate("document.getElementById('review-load').click()")
    assert page.wait_for("document.querySelectorAll('#review-items li[data-review]').length")
    page.evaluate(
        "(() => { document.getElementById('verdict-0-different').click();"
        " document.getElementById('review-apply').click(); })()"
    )
    page.wait_for("document.querySelectorAll('#review-results li[data-line]').length === 1")
    page.evaluate("document.getElementById('review').scrollIntoView()")
    snap(page, tmp, "explorer-review.png")


def outsider_views(page: Page, base: str, world: World, key: str, tmp: Path) -> None:
    as_key(page, base, key)
    state = open_view(page, base, f"entity={quote(world.red)}")
    assert state["nodes"] == 0
    assert "No entity you can see" in state["status"]
    state = open_view(page, base, f"entity={quote(world.beside_red)}&hops=2")
    assert state["nodes"] > 0
    assert world.red not in state["names"]
    assert not state["curation"]  # a query key does not curate
    snap(page, tmp, "explorer-restricted.png")


async def test_the_explorer_in_a_real_browser(
    *, tmp_path: Path, world: World, keys: dict[str, str], api: tuple[str, Settings]
) -> None:
    binary = require_tool("chromium")
    base, on = api

    def drive() -> None:
        with browser(binary, tmp_path / "profile") as page:
            admin_views(page, base, world, keys["admin"], tmp_path)
            outsider_views(page, base, world, keys["outsider"], tmp_path)

    await asyncio.to_thread(drive)
    listed = json.loads(kgstream(on, "curate", "list", "--json").stdout)
    by_page = [c for c in listed if c["reason"] == "one name, two spellings"]
    assert [(c["kind"], c["name"], c["other"]) for c in by_page] == [("merge", *world.merged)]
    assert by_page[0]["created_by"].endswith("(explorer-admin)")
    reviewed = [c for c in listed if c["reason"] == "review explorer:1"]
    assert all(c["created_by"].endswith("(explorer-admin)") for c in reviewed)
    assert all(c["kind"] in ("block", "split") for c in reviewed)  # judged different
    for page_file in ("explorer.html", "explorer.js", "explorer.css"):  # nothing from elsewhere
        assert "://" not in (STATIC / page_file).read_text(encoding="utf-8"), page_file
