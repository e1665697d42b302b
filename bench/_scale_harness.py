"""What the stream benchmarks share: an embedded PostgreSQL and tansu broker in a temporary
home with one or more real indexer worker processes (`kgstream worker indexer`, this
checkout's code, one consumer group), waiting for events to be applied, sampling the resident
memory and CPU time of the processes, and the database's size by table."""

from __future__ import annotations

import contextlib
import json
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
from typing import Any, Self

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
    """A running PostgreSQL + broker + indexer worker(s), and a producer to its topic."""

    home: Path
    url: str
    topic: str
    producer: KafkaProducer
    workers: list[subprocess.Popen[bytes]]
    pg: EmbeddedPostgres
    broker: EmbeddedBroker
    partitions: int = 4
    env: dict[str, str] = field(default_factory=dict)  # the workers'; other processes reuse it

    @property
    def worker(self) -> subprocess.Popen[bytes]:
        """The first (with one worker, the only) indexer process."""
        return self.workers[0]

    def publish(self, events: list[dict[str, Any]]) -> None:
        """Publish ``events`` to the documents topic (keyed by doc_id)."""
        publish_events(self.producer, self.topic, events)

    def warm_up(self, event: dict[str, Any]) -> None:
        """Publish one event under its own id and wait until it is applied: the worker has
        joined its group and loaded its models."""
        self.publish([{**event, "event_id": "warm-up", "doc_id": "warm-up"}])
        wait_for(self.url, 1, 120)

    def warm_up_partitions(self, event: dict[str, Any], settle_s: float = 8.0) -> int:
        """With several workers: one event on every partition, twice, ``settle_s`` apart (the
        group's last join settles meanwhile; tansu joins take half the session timeout), so
        every worker owns its partitions and has loaded its models. Returns the events used."""
        sent = 0
        for round_ in range(2):
            for partition in range(self.partitions):
                body = {**event, "event_id": f"warm-up-{round_}-{partition}"}
                body["doc_id"] = body["event_id"]
                value = json.dumps(body).encode()
                self.producer.send(
                    self.topic, value=value, key=body["doc_id"].encode(), partition=partition
                )
                sent += 1
            self.producer.flush()
            wait_for(self.url, sent, 180)
            if round_ == 0:
                time.sleep(settle_s)
        return sent

    def stop_worker(self) -> None:
        """SIGTERM the worker(s) and wait for them (idempotent)."""
        for worker in self.workers:
            if worker.poll() is None:
                worker.terminate()
        for worker in self.workers:
            worker.wait(timeout=60)


@contextlib.contextmanager
def indexer_stack(
    partitions: int = 4,
    workers: int = 1,
    env: dict[str, str] | None = None,
    worker_log: Path | None = None,
) -> Iterator[Stack]:
    """Start everything in a temporary home, ``workers`` indexer processes in one consumer
    group; stop and delete it all on exit. ``env`` is added to the workers' environment (e.g.
    their log level); ``worker_log`` takes their output."""
    home = Path(tempfile.mkdtemp(prefix="kg-bench-"))
    pg, broker = EmbeddedPostgres(home), EmbeddedBroker(home)
    url, bootstrap = pg.start(), broker.start()
    topic = f"bench-{uuid.uuid4().hex[:6]}"
    procs: list[subprocess.Popen[bytes]] = []
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
        if workers > 1:
            worker_env["KGSTREAM_INDEXER_METRICS_PORT"] = "0"  # one port each
        out = log.enter_context(worker_log.open("wb")) if worker_log is not None else None
        for _ in range(workers):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "services.cli.main", "worker", "indexer"],
                    env=worker_env,
                    cwd=ROOT,
                    stdout=out,
                    stderr=out,
                )
            )
        producer = make_producer(bootstrap, Settings())
        yield Stack(home, url, topic, producer, procs, pg, broker, partitions, worker_env)
    finally:
        if producer is not None:
            producer.close()
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
        log.close()
        broker.stop()
        pg.purge()


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU time of a process from /proc (with ``children``: plus that of its
    reaped children, e.g. PostgreSQL backends that exited); 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def postgres_cpu_seconds(postmaster: int) -> float:
    """CPU time of PostgreSQL: the postmaster, its live backends, and the ones that exited."""
    return cpu_seconds(postmaster, children=True) + sum(
        cpu_seconds(pid) for pid in _children(postmaster)
    )


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


class Sampling:
    """Calls ``sample()`` every ``interval`` s on a thread, from ``with`` entry to exit, then
    ``close()``."""

    interval: float
    _stop: threading.Event
    _thread: threading.Thread

    def __enter__(self) -> Self:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.sample()
                self._stop.wait(self.interval)
        finally:
            self.close()

    def sample(self) -> None:
        """Take one sample."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what sampling held (nothing by default)."""


@dataclass
class MemorySampler(Sampling):
    """Samples, every ``interval`` s on a thread: the indexer's VmRSS, PostgreSQL's PSS (all
    its processes) and the broker's VmRSS, in MiB."""

    indexer: int
    postmaster: int | None
    broker: int | None
    interval: float = 1.0
    samples: list[tuple[float, float, float, float]] = field(default_factory=list)
    _t0: float = field(default_factory=time.perf_counter)

    def sample(self) -> None:
        """The three processes' memory now."""
        indexer = _status_kib(self.indexer, "VmRSS") / 1024
        pg = postgres_pss_kib(self.postmaster) / 1024 if self.postmaster else 0.0
        broker = _status_kib(self.broker, "VmRSS") / 1024 if self.broker else 0.0
        self.samples.append((time.perf_counter() - self._t0, indexer, pg, broker))

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


HIDDEN = "kgstream-bench-hidden"  # the group of the documents ``hide_share`` hides


def hide_share(url: str, share: float) -> int:
    """Give about ``share`` of the documents without an ACL (by a hash of the id) an ACL of
    HIDDEN, so an anonymous caller sees part of the corpus; their count. ``unhide`` undoes it."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            hidden = conn.execute(
                text(
                    "UPDATE documents SET acl = ARRAY[CAST(:g AS text)] WHERE acl IS NULL"
                    " AND abs(hashtext(doc_id)::bigint) % 10000 < :cut"
                ),
                {"g": HIDDEN, "cut": round(share * 10000)},
            ).rowcount
            conn.execute(text("ANALYZE documents"))
        return int(hidden)
    finally:
        engine.dispose()


def unhide(url: str) -> None:
    """Take ``hide_share``'s ACL away again."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE documents SET acl = NULL WHERE acl = ARRAY[CAST(:g AS text)]"),
                {"g": HIDDEN},
            )
            conn.execute(text("ANALYZE documents"))
    finally:
        engine.dispose()
