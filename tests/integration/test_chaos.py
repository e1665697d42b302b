"""Chaos (issue 18, deliverable 8): the whole stack as `kgstream up` runs it, on a PostgreSQL and
a broker of the test's own, under a query flood, while in one run each worker kind is killed
once, the broker restarts (memory storage: it forgets everything) and PostgreSQL freezes. Then:
every event was applied exactly once or dead-lettered, the graph equals a clean run's, no
request answered 5xx outside the outage windows, and readiness told the truth throughout.

The figures (recovery times, request and probe counts, readiness latency) are printed at the
end of the test (`pytest -s`) and copied into docs/BENCHMARKS.md."""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.broker import EmbeddedBroker
from services.core.infra.ports import free_port
from services.core.infra.postgres import EmbeddedPostgres
from services.core.settings import Settings
from tests.support.chaos import Recorder, Windows, children
from tests.support.cli import kgstream
from tests.support.faults import (
    create_topics,
    frozen,
    kill_group,
    moved,
    own_broker,
    own_postgres,
    postgres_pids,
    start_process,
    unprocessed,
    wait_until,
)
from tests.support.graph import Graph, canonical_graph, clean_graph, graph_diff, scalar
from tests.support.records import document_event
from tests.support.workers import Worker, publish_lines, sample_lines

pytestmark = pytest.mark.integration

FLOOD_CLIENTS = 16
FREEZE_S = 8.0
GRACE_S = 3.0
"""A request that ended this long after a window closed still counts as inside it (a client
queued behind the outage finishes after it)."""
APPLIED = "SELECT count(*) FROM processed_events WHERE outcome = 'applied'"


def bad_lines(tag: str) -> list[str]:
    """Three records the contract refuses, each for its own reason."""
    return [
        json.dumps(document_event(event_id=f"bad-text-{tag}", doc_id=f"a-{tag}", text=None)),
        json.dumps(document_event(event_id=f"bad-type-{tag}", doc_id=f"b-{tag}", type="rename")),
        json.dumps(document_event(event_id=f"bad-time-{tag}", doc_id=f"c-{tag}", occurred_at="x")),
    ]


@dataclass
class Run:
    """The stack under test and what the run has seen so far."""

    settings: Settings
    pg: EmbeddedPostgres
    broker: EmbeddedBroker
    up: Worker
    recorder: Recorder
    windows: Windows = field(default_factory=Windows)
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.pg.url

    def publish(self, lines: list[str]) -> None:
        publish_lines(self.broker.bootstrap, self.settings.documents_topic, lines)

    def applied(self, n: int, timeout: float = 240) -> None:
        assert wait_until(lambda: scalar(self.url, APPLIED) == n, timeout), self.tail()

    def kill(self, name: str) -> float:
        """SIGKILL the ``name`` worker, wait until `up` has started another; when it was
        killed (monotonic)."""
        old = children(self.up.pid)[name]
        os.kill(old, signal.SIGKILL)
        killed = time.monotonic()
        restarted = lambda: children(self.up.pid).get(name, old) != old  # noqa: E731
        assert wait_until(restarted, 120), f"`up` did not restart {name}: {self.tail()}"
        return killed

    def ready_since(self, since: float, status: int) -> Callable[[], bool]:
        probes = self.recorder.probes
        return lambda: any(p.start >= since and p.status == status for p in probes)

    def tail(self) -> str:
        return self.up.output()[-4000:]


def kill_each_worker(run: Run, lines: list[str]) -> None:
    """Phases 1-3: the indexer mid-stream, the communities worker after a recompute request,
    the query API under the flood."""
    run.publish(lines[:16] + bad_lines("a"))
    assert wait_until(lambda: scalar(run.url, APPLIED) >= 3, 120), run.tail()
    killed = run.kill("indexer")
    run.applied(16)
    run.figures["indexer kill -> all applied (s)"] = time.monotonic() - killed

    assert kgstream(run.settings, "recompute", process=True).returncode == 0
    killed = run.kill("communities")
    run.figures["communities kill -> restarted (s)"] = time.monotonic() - killed

    with run.windows.open("query-api killed"):
        killed = run.kill("query-api")
        assert wait_until(run.ready_since(time.monotonic(), 200), 120), run.tail()
        run.figures["query-api kill -> ready (s)"] = time.monotonic() - killed


def restart_broker(run: Run, lines: list[str]) -> None:
    """Phase 4: memory storage forgets every record and offset. As `kgstream infra up` does,
    the topics are created again and the publisher resends what has not landed; new bad records
    now land on offsets that earlier ones used."""
    with run.windows.open("broker restart"):
        run.broker.stop()
        bootstrap = run.broker.bootstrap
        assert run.broker.start() == bootstrap
        create_topics(bootstrap, run.settings)
    start = time.monotonic()
    run.publish(unprocessed(run.url, lines[:16]) + lines[16:32] + bad_lines("b"))
    run.applied(32)
    run.figures["broker restart -> all applied (s)"] = time.monotonic() - start
    # The indexer noticed the new log (its topic id), restarted and recorded what was lost
    # (services/indexer/topic_identity.py): never silently.
    losses = "SELECT count(*) FROM broker_losses"
    assert wait_until(lambda: scalar(run.url, losses) >= 1, 120), run.tail()


def freeze_postgres(run: Run, lines: list[str]) -> None:
    """Phase 5: PostgreSQL accepts connections and answers nothing while events arrive."""
    run.publish(lines[32:40])
    # The window lasts until /readyz is 200 again: what fails before is the outage's, however
    # long a loaded machine takes to recover (GRACE_S covers only requests in flight).
    with run.windows.open("postgres frozen"):
        with frozen(postgres_pids(run.pg)):
            froze = time.monotonic()
            assert wait_until(run.ready_since(froze, 503), 60), "/readyz never said 503"
            run.figures["freeze -> /readyz 503 (s)"] = time.monotonic() - froze
            run.publish(lines[40:])
            time.sleep(max(0.0, froze + FREEZE_S - time.monotonic()))  # the outage itself
        thawed = time.monotonic()
        assert wait_until(run.ready_since(thawed, 200), 60), run.tail()
        run.figures["thaw -> /readyz 200 (s)"] = time.monotonic() - thawed
    run.applied(48)
    run.figures["thaw -> all applied (s)"] = time.monotonic() - thawed


def check_requests(run: Run) -> None:
    """No 5xx or unanswered request and no unready probe outside the windows (a probe the
    client gave up on, after 5 s, is unready). Probe latencies are figures, not bounds: a
    loaded 2-core machine stretches them all."""
    rec, windows = run.recorder, run.windows
    failed = [s for s in rec.requests if s.status >= 500 or s.status == 0]
    outside = [s for s in failed if windows.covering(s, GRACE_S) is None]
    assert not outside, outside[:10]
    unready = [p for p in rec.probes if p.status != 200 and windows.covering(p, GRACE_S) is None]
    assert not unready, unready[:10]
    latencies = sorted(p.end - p.start for p in rec.probes if p.status)
    statuses: dict[str, int] = {}
    for s in rec.requests:
        statuses[str(s.status)] = statuses.get(str(s.status), 0) + 1
    run.figures |= {
        "requests": len(rec.requests),
        "requests failed inside windows": len(failed),
        "probes": len(rec.probes),
        "/readyz p50 (ms)": 1000 * statistics.median(latencies),
        "/readyz p99 (ms)": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "/readyz max (ms)": 1000 * latencies[-1],
    }
    print("\nchaos figures:", json.dumps(run.figures, indent=1))
    print("request statuses:", statuses)
    print("windows:", run.windows.spans)


def check_landed(run: Run, clean: Graph) -> None:
    """Every event applied exactly once or dead-lettered, and the graph a clean run builds."""
    assert scalar(run.url, APPLIED) == 48
    others = "SELECT count(*) FROM processed_events WHERE outcome <> 'applied'"
    assert scalar(run.url, others) == 0
    reasons = "SELECT coalesce(array_agg(reason ORDER BY id), '{}') FROM dead_letters"
    letters = scalar(run.url, reasons)
    assert len(letters) == 6, letters
    got = canonical_graph(run.url)
    assert got == clean, graph_diff(got, clean)


def test_chaos_whole_stack(
    settings: Settings,
    tmp_path: Path,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    lines = sample_lines()
    clean = clean_graph(
        str(settings.database_url),
        lines,
        embedder=embedder,
        extractor=extractor,
        executor=cpu_pool,
        settings=settings,
    )
    with (
        own_postgres(tmp_path / "pg") as pg,
        own_broker(tmp_path / "broker", settings) as broker,
    ):
        own = moved(settings, database_url=pg.url, kafka_bootstrap_servers=broker.bootstrap)
        port = free_port()
        # The readiness budget (0.8 s by default) is not what this test is about: its 503s must
        # come from the outages. A CI run with two other test workers on two cores once took
        # 0.9 s for the probe's database read outside any outage; 2 s is still well inside the
        # prober's 5 s, and a frozen database still fails it.
        env = {"KGSTREAM_API_PORT": str(port), "KGSTREAM_READINESS_BUDGET_S": "2.0"}
        up = start_process(own, tmp_path / "up.log", "up", env=env)
        try:
            assert wait_until(lambda: "Ctrl-C to stop" in up.output(), 240), up.output()[-4000:]
            assert set(children(up.pid)) == {"indexer", "communities", "query-api"}
            with Recorder(f"http://127.0.0.1:{port}", FLOOD_CLIENTS) as recorder:
                run = Run(own, pg, broker, up, recorder)
                kill_each_worker(run, lines)
                restart_broker(run, lines)
                freeze_postgres(run, lines)
                time.sleep(2)  # the flood goes on for a while after the last outage
            # The restarted communities worker still recomputes.
            done = kgstream(own, "recompute", "--wait", timeout=600, process=True)
            assert done.returncode == 0, done.stdout + done.stderr
            assert up.alive(), run.tail()
            up.proc.send_signal(signal.SIGINT)
            assert up.proc.wait(timeout=120) == 0, run.tail()
        finally:
            kill_group(up)
        check_landed(run, clean)
        check_requests(run)
