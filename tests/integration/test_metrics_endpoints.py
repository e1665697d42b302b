"""All three processes as real subprocesses on the test's database and broker: each registers
its metrics address in the processes table, answers /healthz and /readyz, serves /metrics that
promtool accepts, and its figures move when documents are ingested and questions asked."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.core.infra.ports import free_port
from services.core.settings import Settings
from tests.support.cli import kgstream
from tests.support.faults import kill_group, start_process, wait_until
from tests.support.graph import scalar
from tests.support.metrics_text import total
from tests.support.tools import require_tool
from tests.support.workers import SAMPLE_EVENTS, Worker, publish_lines, sample_lines

pytestmark = pytest.mark.integration

NAMES = ("indexer", "communities", "query-api")
STAGES = ("decode", "chunk", "embed", "extract", "resolve", "write")


@pytest.fixture
def stack(settings: Settings, tmp_path: Path) -> Iterator[dict[str, Worker]]:
    """The three processes, metrics ports 0 (any free port), the API on a free port."""
    procs = {
        "indexer": start_process(
            settings,
            tmp_path / "indexer.log",
            "worker",
            "indexer",
            env={"KGSTREAM_INDEXER_METRICS_PORT": "0"},
        ),
        "communities": start_process(
            settings,
            tmp_path / "communities.log",
            "worker",
            "communities",
            env={
                "KGSTREAM_COMMUNITIES_METRICS_PORT": "0",
                "KGSTREAM_COMMUNITIES_CHECK_INTERVAL_S": "1",
                "KGSTREAM_COMMUNITIES_MIN_INTERVAL_S": "0",
            },
        ),
        "query-api": start_process(
            settings,
            tmp_path / "api.log",
            "worker",
            "query-api",
            env={"KGSTREAM_API_PORT": str(free_port())},
        ),
    }
    try:
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()
            kill_group(proc)


def registered(url: str) -> dict[str, str]:
    """name -> metrics URL of the processes with a row (fresh or not)."""
    rows = scalar(url, "SELECT coalesce(json_agg(json_build_array(name, metrics_url)), '[]')"
                  " FROM processes")  # fmt: skip
    return dict(rows)


def scrape(metrics_url: str) -> str:
    response = httpx.get(metrics_url, timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


def status_of(metrics_url: str, route: str) -> int:
    try:
        return httpx.get(metrics_url.replace("/metrics", route), timeout=10).status_code
    except httpx.TransportError:
        return 0


def promtool_check(promtool: str, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_every_process_serves_metrics_and_health_and_the_figures_move(
    settings: Settings, stack: dict[str, Worker]
) -> None:
    promtool = require_tool("promtool")
    url = str(settings.database_url)

    def logs() -> str:
        return "\n".join(f"--- {n}\n{p.output()[-2500:]}" for n, p in stack.items())

    # Every process registers its metrics address; all three are alive and ready.
    assert wait_until(lambda: set(registered(url)) == set(NAMES), 120), logs()
    urls = registered(url)
    for metrics_url in urls.values():
        assert status_of(metrics_url, "/healthz") == 200
    ready = lambda: all(status_of(u, "/readyz") == 200 for u in urls.values())  # noqa: E731
    assert wait_until(ready, 120), logs()
    listed = kgstream(settings, "status", "--json")
    assert listed.returncode == 0, listed.stderr
    processes = json.loads(listed.stdout)["processes"]
    assert {p["name"]: p["metrics_url"] for p in processes} == urls
    assert {p["pid"] for p in processes} == {p.pid for p in stack.values()}

    before = {name: scrape(u) for name, u in urls.items()}
    for name, text in before.items():
        assert total(text, "kgstream_build_info", process=name) == 1, name
        assert total(text, "process_start_time_seconds") > 0, name
        assert 'kgstream_db_pool_connections{state="idle"}' in text, name
    assert total(before["indexer"], "kgstream_indexer_events_total") == 0

    lines = sample_lines()
    publish_lines(str(settings.kafka_bootstrap_servers), settings.documents_topic, lines)

    def handled() -> bool:
        return total(scrape(urls["indexer"]), "kgstream_indexer_events_total") >= len(lines)

    assert wait_until(handled, 300, poll=1), logs()
    ask_questions(urls["query-api"].removesuffix("/metrics"), 3)

    def settled() -> bool:
        """The worker shows the published snapshot, builds no other, and is not between
        deciding a recompute and publishing it (a tick past the change threshold right after
        the first snapshot, while the last events were still changing the graph, starts a
        second one: its decision is counted before its snapshot exists)."""
        text = scrape(urls["communities"])
        shown = total(text, "kgstream_communities_snapshot_id")
        building = scalar(url, "SELECT count(*) FROM snapshots WHERE status = 'building'")
        decided = total(text, "kgstream_communities_checks_total", decision="recompute")
        done = total(text, "kgstream_communities_recomputes_total")
        ok = shown > 0 and shown == published_id(url) and building == 0 and decided == done
        if ok:  # the settled scrape is the one asserted on: a later tick may start another
            settled_scrape["communities"] = text
            settled_at.append(shown)
        return ok

    settled_scrape: dict[str, str] = {}
    settled_at: list[float] = []

    assert wait_until(settled, 300, poll=1), logs()
    lag = lambda: "kgstream_indexer_consumer_lag{" in scrape(urls["indexer"])  # noqa: E731
    assert wait_until(lag, 60, poll=1), logs()

    # A tick may publish another snapshot while the API is scraped: read it on both sides.
    published_before = published_id(url)
    after = {name: scrape(u) for name, u in urls.items()} | settled_scrape
    published = (published_before, published_id(url))
    assert_indexer_moved(settings, before["indexer"], after["indexer"], len(lines))
    assert_query_moved(after["query-api"], 3, published)
    assert_communities_moved(url, after["communities"], int(settled_at[-1]))
    for name, text in after.items():
        checked = promtool_check(promtool, text)
        assert checked.returncode == 0, f"{name}: {checked.stdout}{checked.stderr}"

    # An orderly stop deletes each process's row.
    for proc in stack.values():
        proc.stop()
    assert scalar(url, "SELECT count(*) FROM processes") == 0, logs()


def ask_questions(api: str, n: int) -> None:
    questions = [
        json.loads(q)["question"]
        for q in (SAMPLE_EVENTS.parent / "questions.jsonl").read_text().splitlines()[:n]
    ]
    for question in questions:
        body = {"question": question, "mode": "vector"}
        answered = httpx.post(f"{api}/v1/query", json=body, timeout=60)
        assert answered.status_code == 200, answered.text


def assert_indexer_moved(settings: Settings, before: str, after: str, events: int) -> None:
    url = str(settings.database_url)
    chunks = scalar(url, "SELECT count(*) FROM chunks")
    applied = total(after, "kgstream_indexer_events_total", outcome="applied")
    assert applied == events == scalar(url, "SELECT count(*) FROM processed_events")
    for stage in STAGES:
        count = total(after, "kgstream_indexer_stage_seconds_count", stage=stage)
        assert count > total(before, "kgstream_indexer_stage_seconds_count", stage=stage), stage
    assert total(after, "kgstream_indexer_freshness_seconds_count", since="published") == applied
    # The sample's occurred_at are in 2024: back-fills, which "since occurred" leaves out
    # (services/core/clocks.py, occurred_plausibly).
    assert total(after, "kgstream_indexer_freshness_seconds_count", since="occurred") == 0
    assert total(after, "kgstream_indexer_batch_size_sum") == events
    assert total(after, "kgstream_indexer_chunks_total", result="embedded") == chunks
    assert total(after, "kgstream_indexer_consumer_lag", topic=settings.documents_topic) >= 0
    assert total(after, "kgstream_model_inputs_total", purpose="embed_chunks") == chunks
    assert total(after, "kgstream_model_calls_total", purpose="extract") > 0


def assert_query_moved(text: str, asked: int, published: tuple[int, int]) -> None:
    """``published``: the published snapshot id read before and after the scrape of ``text``."""
    assert total(text, "kgstream_query_requests_total", mode="vector", status="200") == asked
    assert total(text, "kgstream_query_seconds_count", mode="vector") == asked
    assert total(text, "kgstream_query_contexts_count", mode="vector") == asked
    assert total(text, "kgstream_model_calls_total", purpose="embed_query") == asked
    route = {"route": "/v1/query", "method": "POST", "status": "200"}
    assert total(text, "kgstream_http_requests_total", **route) == asked
    low, high = published
    assert low <= total(text, "kgstream_query_snapshot_id") <= high, published


def published_id(url: str) -> int:
    return int(scalar(url, "SELECT coalesce(max(id), 0) FROM snapshots WHERE status = 'published'"))


def assert_communities_moved(url: str, text: str, published: int) -> None:
    """``text``: a scrape of the settled worker, which showed snapshot ``published``."""
    assert total(text, "kgstream_communities_snapshot_id") == published
    recomputes = total(text, "kgstream_communities_recomputes_total", result="published")
    assert recomputes >= 1
    assert total(text, "kgstream_communities_by_level") == scalar(
        url, "SELECT count(*) FROM communities WHERE snapshot_id = :s", s=published
    )
    assert total(text, "kgstream_communities_recompute_seconds_count", phase="leiden") == recomputes
    assert total(text, "kgstream_communities_checks_total", decision="recompute") == recomputes
    assert total(text, "kgstream_communities_reports_total", result="generated") > 0
    assert total(text, "kgstream_communities_lock_wait_seconds_count") >= 1
    assert total(text, "kgstream_communities_snapshot_age_seconds") >= 0
