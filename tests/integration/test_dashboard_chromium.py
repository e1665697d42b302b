"""/dashboard in Debian's headless Chromium against a running query API with an operating
history: every chart holds data points (the page's data-points attributes), and a screenshot
is saved under the test's tmp_path (dashboard.png)."""

from __future__ import annotations

import asyncio
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps
from services.query_api.dashboard import STATIC
from tests.integration.test_status_dashboard import (
    CHARTS,
    ask_questions,
    dashboard_with_samples,
    running_api,
)
from tests.support.activity import build_history
from tests.support.cdp import OFFLINE
from tests.support.openai_stub import OpenAIStub
from tests.support.tools import require_tool

pytestmark = pytest.mark.integration

_PANEL = re.compile(r'<section class="panel" id="chart-(\w+)" data-chart="\w+" data-points="(\d+)"')


def chromium(binary: str, tmp: Path, url: str, *args: str) -> str:
    """Headless Chromium on ``url`` (flags that keep it off the network but for ``url``)."""
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    cmd = [
        binary,
        *OFFLINE,
        f"--user-data-dir={profile}",
        "--virtual-time-budget=8000",
        *args,
        url,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def browse(binary: str, tmp: Path, url: str) -> tuple[str, Path]:
    """Wait for the sampler, then read the rendered DOM and take the screenshot."""
    ask_questions(url)
    data = dashboard_with_samples(url)
    assert all(c["points"] > 0 for c in data["charts"].values()), data["charts"]
    dom = chromium(binary, tmp, f"{url}/dashboard", "--dump-dom")
    shot = tmp / "dashboard.png"
    chromium(binary, tmp, f"{url}/dashboard", f"--screenshot={shot}", "--window-size=1400,1800")
    return dom, shot


async def test_dashboard_renders_every_chart_with_data(
    *,
    tmp_path: Path,
    deps: IndexerDeps,
    settings: Settings,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
    openai_stub: OpenAIStub,
) -> None:
    binary = require_tool("chromium")
    history = await build_history(deps, settings, embedder, openai_stub)
    with running_api(settings, embedder, extractor, cpu_pool) as url:
        dom, shot = await asyncio.to_thread(browse, binary, tmp_path, url)
    assert 'data-state="ready"' in dom, dom[:3000]
    counts = {name: int(n) for name, n in _PANEL.findall(dom)}
    assert set(counts) == CHARTS
    assert all(n > 0 for n in counts.values()), counts
    assert dom.count('class="uplot') == len(CHARTS)  # one uPlot per chart
    assert f"<td>{history.snapshot_id}</td>" in dom  # the snapshot table
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
    for page in ("dashboard.html", "dashboard.js", "dashboard.css"):  # nothing from elsewhere
        assert "://" not in (STATIC / page).read_text(encoding="utf-8"), page
