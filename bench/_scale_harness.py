"""What the stream benchmarks share: an embedded PostgreSQL and tansu broker in a temporary
home with one real indexer worker process (`kgstream worker indexer`, this checkout's code),
waiting for events to be applied, sampling the resident memory of the processes, and the
database's size by table."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka import KafkaProducer
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.core.db import migrations  # noqa: E402
from services.core.infra.broker import EmbeddedBroker  # noqa: E402
from services.core.infra.postgres import EmbeddedPostgres  # noqa: E402
from services.core.infra.topics import ensure_topics  # noqa: E402
from services.core.producer import make_producer, publish_events  # noqa: E402
from services.core.settings import Settings  # noqa: E402


def processed(url: str) -> int:
    """Events the indexer has applied (rows of processed_events)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.scalar(text("SELECT count(*) FROM processed_events")) or 0)
    finally:
        engine.dispose()


def wait_for(
    url: str, n: int, timeout: float, progress: Callable[[int], None] | None = None
) -> float:
    """perf_counter() once ``n`` events are applied; TimeoutError after ``timeout`` s."""
    start = time.perf_counter()
    while (done := processed(url)) < n:
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"{done}/{n} processed after {timeout:.0f}s")
        if progress is not None:
            progress(done)
        time.sleep(0.2)
    return time.perf_counter()


@dataclass
class Stack:
    """A running PostgreSQL + broker + indexer worker, and a producer to its topic."""

    home: Path
    url: str
    topic: str
    producer: KafkaProducer
    worker: subprocess.Popen[bytes]
    pg: EmbeddedPostgres
    broker: EmbeddedBroker
    env: dict[str, str] = field(default_factory=dict)  # the worker's; other processes reuse it

    def publish(self, events: list[dict[str, Any]]) -> None:
        """Publish ``events`` to the documents topic (keyed by doc_id)."""
        publish_events(self.producer, self.topic, events)

    def warm_up(self, event: dict[str, Any]) -> None:
        """Publish one event under its own id and wait until it is applied: the worker has
        joined its group and loaded its models."""
        self.publish([{**event, "event_id": "warm-up", "doc_id": "warm-up"}])
        wait_for(self.url, 1, 120)

    def stop_worker(self) -> None:
        """SIGTERM the worker and wait for it (idempotent)."""
        if self.worker.poll() is None:
            self.worker.terminate()
            self.worker.wait(timeout=60)


@contextlib.contextmanager
def indexer_stack(
    partitions: int = 4, env: dict[str, str] | None = None, worker_log: Path | None = None
) -> Iterator[Stack]:
    """Start everything in a temporary home; stop and delete it all on exit. ``env`` is added
    to the worker's environment (e.g. its log level); ``worker_log`` takes its output."""
    home = Path(tempfile.mkdtemp(prefix="kg-bench-"))
    pg, broker = EmbeddedPostgres(home), EmbeddedBroker(home)
    url, bootstrap = pg.start(), broker.start()
    topic = f"bench-{uuid.uuid4().hex[:6]}"
    worker: subprocess.Popen[bytes] | None = None
    producer: KafkaProducer | None = None
    log = contextlib.ExitStack()
    try:
        migrations.upgrade(url, 384)
        ensure_topics(bootstrap, {topic: partitions, f"{topic}.dlq": 1})
        worker_env = {
            **os.environ,
            "KGSTREAM_HOME": str(home),
            "KGSTREAM_DATABASE_URL": url,
            "KGSTREAM_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "KGSTREAM_DOCUMENTS_TOPIC": topic,
            "KGSTREAM_DLQ_TOPIC": f"{topic}.dlq",
            "KGSTREAM_LOG_LEVEL": "WARNING",
            **(env or {}),
        }
        out = log.enter_context(worker_log.open("wb")) if worker_log is not None else None
        worker = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", "worker", "indexer"],
            env=worker_env,
            cwd=ROOT,
            stdout=out,
            stderr=out,
        )
        producer = make_producer(bootstrap, Settings())
        yield Stack(home, url, topic, producer, worker, pg, broker, worker_env)
    finally:
        if producer is not None:
            producer.close()
        if worker is not None and worker.poll() is None:
            worker.terminate()
            worker.wait(timeout=60)
        log.close()
        broker.stop()
        pg.purge()


def _status_kib(pid: int, key: str) -> int:
    """A ``kB`` field of /proc/PID/status (0 when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _pss_kib(pid: int) -> int:
    """Proportional set size of one process (shared pages divided among their users)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _children(parent: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                out.append(int(entry.name))
    return out


def postgres_pss_kib(postmaster: int) -> int:
    """PSS of the postmaster and all its backends together (shared buffers counted once)."""
    return sum(_pss_kib(pid) for pid in [postmaster, *_children(postmaster)])


@dataclass
class MemorySampler:
    """Samples, every ``interval`` s on a thread: the indexer's VmRSS, PostgreSQL's PSS (all
    its processes) and the broker's VmRSS, in MiB."""

    indexer: int
    postmaster: int | None
    broker: int | None
    interval: float = 1.0
    samples: list[tuple[float, float, float, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> MemorySampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.is_set():
            indexer = _status_kib(self.indexer, "VmRSS") / 1024
            pg = postgres_pss_kib(self.postmaster) / 1024 if self.postmaster else 0.0
            broker = _status_kib(self.broker, "VmRSS") / 1024 if self.broker else 0.0
            self.samples.append((time.perf_counter() - t0, indexer, pg, broker))
            self._stop.wait(self.interval)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per process: the value at the start, at 25% of the run, at the end, and the peak;
        ``flat`` for the indexer = end within 10% of the value at 25%."""
        out: dict[str, dict[str, float]] = {}
        if not self.samples:
            return out
        names = ("indexer_rss_mib", "postgres_pss_mib", "broker_rss_mib")
        for column, name in enumerate(names, start=1):
            values = [s[column] for s in self.samples]
            quarter = values[len(values) // 4]
            out[name] = {
                "start": round(values[0], 1),
                "at_25pct": round(quarter, 1),
                "end": round(values[-1], 1),
                "peak": round(max(values), 1),
                "end_vs_25pct": round(values[-1] / quarter, 3) if quarter else 0.0,
            }
        out["indexer_rss_mib"]["samples"] = len(self.samples)
        return out


def table_sizes(url: str) -> dict[str, dict[str, int]]:
    """Every user table: rows (exact count) and total bytes (with indexes and TOAST)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            names = conn.scalars(
                text("SELECT relname FROM pg_stat_user_tables ORDER BY relname")
            ).all()
            out = {}
            for name in names:
                size = conn.scalar(text("SELECT pg_total_relation_size(:t)"), {"t": name})
                rows = conn.scalar(text(f'SELECT count(*) FROM "{name}"'))  # noqa: S608 - catalogue
                out[str(name)] = {"rows": int(rows or 0), "bytes": int(size or 0)}
            return out
    finally:
        engine.dispose()
