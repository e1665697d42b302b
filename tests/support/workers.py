"""Indexer worker processes and the broker around them: start and stop workers, publish a
JSONL corpus keyed by doc_id, and read a consumer group's committed offsets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kafka import KafkaAdminClient, KafkaProducer, TopicPartition

from services.core.settings import Settings
from tests.support.cli import env_for

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_EVENTS = ROOT / "services" / "cli" / "sample" / "events.jsonl"


@dataclass
class Worker:
    """One `kgstream worker indexer` process, its output in ``log``."""

    proc: subprocess.Popen[bytes]
    log: Path
    consumer_group: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final offset commit."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def ready(self) -> bool:
        """faust says so (at log level INFO) once it has its partitions."""
        return "[^Worker]: Ready" in self.output()

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used (Linux /proc)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_worker(
    settings: Settings,
    log: Path,
    *,
    consumer_group: str | None = None,
    log_level: str = "INFO",
    log_format: str = "text",
) -> Worker:
    """Start an indexer process on ``settings`` (its own consumer group when given)."""
    group = consumer_group or settings.consumer_group
    env = {
        **env_for(settings),
        "KGSTREAM_CONSUMER_GROUP": group,
        "KGSTREAM_LOG_LEVEL": log_level,
        "KGSTREAM_LOG_FORMAT": log_format,
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", "worker", "indexer"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    return Worker(proc, log, group)


def noticed_broker_gone(worker: Worker, timeout: float = 60) -> None:
    """Wait until the worker's log shows it lost the broker (after this call started): an
    outage that lasts until the worker has seen it, instead of a fixed sleep."""
    seen = len(worker.output())
    signs = ("ECONNREFUSED", "Connect call failed", "socket disconnected", "Connection lost")

    def noticed() -> bool:
        return any(sign in worker.output()[seen:] for sign in signs)

    deadline = time.monotonic() + timeout
    while not noticed():
        assert time.monotonic() < deadline, worker.output()[-3000:]
        time.sleep(0.1)


def restarted_after_replaced_log(worker: Worker, settings: Settings, log: Path) -> Worker:
    """What `kgstream up` or Kubernetes do when the broker replaced the documents topic (a
    restart on memory storage): the indexer notices the new topic id and exits to be
    restarted (services/indexer/topic_identity.py); a new one is started here. Fails with the
    worker's output if it does not exit so within 60 s."""
    try:
        code = worker.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            "the indexer did not notice the replaced topic: " + worker.output()[-3000:]
        ) from None
    assert code == 3, worker.output()[-3000:]  # services.indexer.app.REJOIN_EXIT_CODE
    assert "the broker replaced topic" in worker.output(), worker.output()[-3000:]
    return start_worker(settings, log, consumer_group=worker.consumer_group)


def stop_workers(workers: Iterable[Worker]) -> None:
    for w in workers:
        w.stop()


def wait_ready(workers: Sequence[Worker], timeout: float = 90) -> bool:
    """Wait until every worker has joined its group and is ready (or one died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(w.ready() for w in workers):
            return True
        if not all(w.alive() for w in workers):
            return False
        time.sleep(0.2)
    return False


@dataclass(frozen=True)
class Published:
    """Where each published line landed."""

    doc_id: str
    partition: int
    offset: int


def sample_lines() -> list[str]:
    """The 48 sample events, one JSON line each."""
    return SAMPLE_EVENTS.read_text(encoding="utf-8").splitlines()


def publish_lines(bootstrap: str, topic: str, lines: Sequence[str]) -> list[Published]:
    """Send each line (a JSON event) keyed by its doc_id, in order, and wait for the acks."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        futures = []
        for line in lines:
            doc_id = str(json.loads(line)["doc_id"])
            futures.append((doc_id, producer.send(topic, key=doc_id.encode(), value=line.encode())))
        producer.flush(timeout=60)
        return [Published(d, f.get(60).partition, f.get(60).offset) for d, f in futures]
    finally:
        producer.close(timeout=10)


def end_offsets(published: Iterable[Published]) -> dict[int, int]:
    """partition -> offset after the last published record (computed from the acks, since
    tansu's own end offsets are approximate: docs/architecture.md, "The embedded broker
    (tansu)")."""
    ends: dict[int, int] = {}
    for p in published:
        ends[p.partition] = max(ends.get(p.partition, 0), p.offset + 1)
    return ends


def committed_offsets(
    bootstrap: str, group: str, topic: str, partitions: Iterable[int]
) -> dict[int, int]:
    """partition -> the group's committed offset on ``topic`` (missing: nothing committed)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        found = admin.list_group_offsets({group: [TopicPartition(topic, p) for p in partitions]})
    finally:
        admin.close()
    return {
        tp.partition: int(meta.offset)
        for tp, meta in found.get(group, {}).items()
        if tp.topic == topic and meta is not None and meta.offset >= 0
    }


def wait_committed(
    bootstrap: str,
    group: str,
    topic: str,
    ends: dict[int, int],
    *,
    timeout: float = 120,
    poll: float = 0.5,
) -> dict[int, int]:
    """Poll until the group has committed at least ``ends`` on every partition (or timeout);
    return the last committed offsets seen."""
    deadline = time.monotonic() + timeout
    while True:
        committed = committed_offsets(bootstrap, group, topic, ends)
        if all(committed.get(p, -1) >= end for p, end in ends.items()):
            return committed
        if time.monotonic() > deadline:
            return committed
        time.sleep(poll)


def assert_all_committed(
    worker: Worker, settings: Settings, published: Iterable[Published], timeout: float = 180
) -> None:
    """Wait until ``worker``'s group has committed past every ``published`` record of the
    documents topic, and fail with the tail of the worker's log if it does not, or died."""
    ends = end_offsets(published)
    bootstrap = str(settings.kafka_bootstrap_servers)
    topic = settings.documents_topic
    committed = wait_committed(bootstrap, worker.consumer_group, topic, ends, timeout=timeout)
    assert all(committed.get(p, -1) >= e for p, e in ends.items()), worker.output()[-3000:]
    assert worker.alive(), worker.output()[-3000:]
