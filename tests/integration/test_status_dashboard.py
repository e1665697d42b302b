"""/v1/status, /v1/dashboard and `kgstream status [--watch]` after real ingest: documents
through the broker and the indexer's handler, a dead letter, LLM token use, lag, a real
recompute, and queries answered by a running API (uvicorn on a free port)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.manager import Endpoints
from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps
from services.query_api.app import create_app
from services.retrieval.service import build_query_service
from tests.support.activity import History, build_history
from tests.support.cli import env_for, kgstream
from tests.support.openai_stub import OpenAIStub
from tests.support.server import serve

pytestmark = pytest.mark.integration

CHARTS = {
    "throughput",
    "freshness",
    "lag",
    "change_ratio",
    "snapshots",
    "dead_letters",
    "query_latency",
    "tokens",
}
QUESTIONS = {"vector": "Where is Watertown International Airport?", "local": "Who was Bach?"}


@contextmanager
def running_api(
    settings: Settings, embedder: OnnxMiniLmEmbedder, extractor: SpacyExtractor, pool: Any
) -> Iterator[str]:
    """The query API with a fast sampler, on a free loopback port (no keys needed there)."""
    assert settings.database_url is not None
    fast = settings.model_copy(update={"dashboard_sample_s": 0.2, "dashboard_refresh_s": 1.0})
    service = build_query_service(
        fast, make_engine(settings.database_url), embedder, extractor, pool
    )
    endpoints = Endpoints(settings.database_url, str(settings.kafka_bootstrap_servers))
    with serve(create_app(fast, endpoints, service=service)) as url:
        yield url


def ask_questions(url: str) -> set[str]:
    """Answer the questions a few times each; the modes used (the latency chart's labels)."""
    used = set()
    for mode, question in QUESTIONS.items():
        for _ in range(3):
            body = {"question": question, "mode": mode}
            resp = httpx.post(f"{url}/v1/query", json=body, timeout=60)
            assert resp.status_code == 200, resp.text
            used.add(resp.json()["mode_used"])
    return used


def dashboard_with_samples(url: str) -> dict[str, Any]:
    """/v1/dashboard once the sampler has seen lag, the change ratio and the queries (polled;
    the caller asserts on what it returns)."""
    deadline = time.monotonic() + 60  # a bound for a broken run, not a measure
    while True:
        data: dict[str, Any] = httpx.get(f"{url}/v1/dashboard", timeout=30).json()
        seen = all(data["charts"][c]["points"] > 0 for c in ("lag", "query_latency"))
        if seen or time.monotonic() > deadline:
            return data
        time.sleep(0.2)  # pacing: the sampler runs every 0.2 s


def check_status(data: dict[str, Any], history: History, settings: Settings) -> None:
    # The keys status had before stay as they were.
    assert data["documents"] == history.applied
    assert data["dead_letters"] == history.dead_letters
    assert data["snapshot"]["id"] == history.snapshot_id
    assert data["change_ratio"] == 0.0  # nothing changed since the recompute
    [partition] = data["indexer"]["partitions"]
    assert partition["next_offset"] == history.applied + 1
    assert data["indexer"]["lag_source"] == "broker end offsets"
    assert partition["lag"] == history.lag  # the record left on the topic
    # Throughput: every event of the history was handled within the last five minutes (the
    # poison record never decoded to an event: it has a dead letter but no processed event).
    five = data["throughput"]["5m"]
    assert (five["applied"], five["handled"]) == (history.applied, history.applied)
    assert five["applied_per_s"] == round(history.applied / 300, 3)
    assert data["throughput"]["1m"]["applied"] <= history.applied
    # Freshness: events occurred 20 s before they were published, so at least that.
    fresh = data["freshness"]
    occurred, published = fresh["since_occurred"], fresh["since_published"]
    assert occurred["events"] == published["events"] == history.applied
    assert 20 <= occurred["p50_s"] <= occurred["p99_s"]
    assert 0 < published["p50_s"] <= published["p99_s"] < occurred["p99_s"]
    assert data["dead_letters_by_reason"] == {"invalid_json": 1}
    assert data["change"] == {
        "ratio": 0.0,
        "threshold": settings.recompute_threshold,
        "over_threshold": False,
    }
    [snap] = data["snapshots"]
    assert (snap["id"], snap["status"]) == (history.snapshot_id, "published")
    assert snap["recompute_s"] > 0
    assert snap["communities"] > 0
    [tokens] = data["tokens"]
    assert (tokens["purpose"], tokens["model"], tokens["rows"]) == ("extraction", "stub-llm", 2)
    assert tokens["prompt_tokens"] > 0
    assert tokens["completion_tokens"] > 0


def check_dashboard(
    data: dict[str, Any], status: dict[str, Any], history: History, modes: set[str]
) -> None:
    charts = data["charts"]
    assert set(charts) == CHARTS
    for name, chart in charts.items():
        assert chart["points"] > 0, name
        for s in chart["series"]:
            assert len(s["values"]) == len(chart["t"]), name
    assert len(charts["throughput"]["t"]) == data["window_s"] / data["step_s"]
    applied = {s["name"]: s["values"] for s in charts["throughput"]["series"]}["applied"]
    assert max(v for v in applied if v is not None) > 0
    fresh = {s["name"]: s["values"] for s in charts["freshness"]["series"]}
    assert any(v is not None and v >= 20 for v in fresh["p50 since occurred"])
    [dead] = charts["dead_letters"]["series"]
    assert (dead["name"], sum(dead["values"])) == ("invalid_json", 1)
    [tokens] = charts["tokens"]["series"]
    reported = status["tokens"][0]
    assert tokens["name"] == "extraction · stub-llm"
    assert sum(tokens["values"]) == reported["prompt_tokens"] + reported["completion_tokens"]
    assert [r["id"] for r in charts["snapshots"]["rows"]] == [history.snapshot_id]
    ratio = {s["name"]: s["values"] for s in charts["change_ratio"]["series"]}
    assert set(ratio["threshold"]) == {data["threshold"]}
    assert 0.0 in ratio["change ratio"]
    [lag] = charts["lag"]["series"]
    assert max(v for v in lag["values"] if v is not None) <= history.lag
    # The process registry is shared with the suite's other in-process APIs: modes this test
    # did not ask may have series, but only the asked ones have points since this API started.
    latency = {
        s["name"]
        for s in charts["query_latency"]["series"]
        if any(v is not None for v in s["values"])
    }
    assert latency == {f"{m} {q}" for m in modes for q in ("p50", "p99")}
    assert "vector" in modes


def exercise_api(url: str, history: History, settings: Settings) -> None:
    modes = ask_questions(url)
    status = httpx.get(f"{url}/v1/status", timeout=30).json()
    check_status(status, history, settings)
    check_dashboard(dashboard_with_samples(url), status, history, modes)
    page = httpx.get(f"{url}/dashboard")
    assert page.status_code == 200
    assert 'src="static/vendor/uplot/uPlot.iife.min.js"' in page.text
    uplot = httpx.get(f"{url}/static/vendor/uplot/uPlot.iife.min.js")
    assert uplot.status_code == 200
    assert "uPlot" in uplot.text


async def test_status_dashboard_and_cli_after_ingest(
    *,
    deps: IndexerDeps,
    settings: Settings,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
    openai_stub: OpenAIStub,
) -> None:
    history = await build_history(deps, settings, embedder, openai_stub)
    with running_api(settings, embedder, extractor, cpu_pool) as url:
        await asyncio.to_thread(exercise_api, url, history, settings)
    shown = await asyncio.to_thread(kgstream, settings, "status")
    assert shown.returncode == 0, shown.stderr
    assert "freshness: since published: p50" in shown.stdout
    assert "dead letters: invalid_json 1" in shown.stdout
    assert f"#{history.snapshot_id} published" in shown.stdout


def test_status_watch_refreshes_until_ctrl_c(settings: Settings) -> None:
    args = [sys.executable, "-m", "services.cli.main", "status", "--watch", "--interval", "0.2"]
    proc = subprocess.Popen(
        args, env=env_for(settings), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    headers = 0
    for line in proc.stdout:
        headers += line.startswith("kgstream status at")
        if headers == 2:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert headers == 2
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "KeyboardInterrupt" not in err
