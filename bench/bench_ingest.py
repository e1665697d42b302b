"""Ingest throughput end to end, against the bare embed + extract loop in the same run.

Starts an embedded PostgreSQL and tansu broker in a temporary home, migrates, starts one
indexer worker process (`kgstream worker indexer`), waits until it consumes, publishes the
events with kafka-python and times publish -> all events processed. Then runs
bench/bench_embed_extract.py on the same events and prints both and their ratio as JSON.
The worker runs this checkout's code (its working directory is the repository root).

    .venv/bin/python bench/bench_ingest.py [EVENTS.jsonl] [--quick]

The default input is the 994-document HotpotQA set the target is measured on; ``--quick``
takes its first 100 events (a smoke run of well under a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.core.db import migrations  # noqa: E402
from services.core.infra.broker import EmbeddedBroker  # noqa: E402
from services.core.infra.postgres import EmbeddedPostgres  # noqa: E402
from services.core.infra.topics import ensure_topics  # noqa: E402
from services.core.producer import make_producer, publish_events  # noqa: E402
from services.core.settings import Settings  # noqa: E402

DEFAULT = ROOT.parent / "shared" / "data" / "hotpotqa-train100" / "events_full.jsonl"
QUICK_EVENTS = 100


def processed(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.scalar(text("SELECT count(*) FROM processed_events")) or 0)
    finally:
        engine.dispose()


def wait_for(url: str, n: int, timeout: float) -> float:
    start = time.perf_counter()
    while processed(url) < n:
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"{processed(url)}/{n} processed after {timeout:.0f}s")
        time.sleep(0.2)
    return time.perf_counter()


def pipeline(events: list[dict[str, object]]) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix="kg-bench-"))
    pg, broker = EmbeddedPostgres(home), EmbeddedBroker(home)
    url, bootstrap = pg.start(), broker.start()
    topic = f"bench-{uuid.uuid4().hex[:6]}"
    worker = None
    try:
        migrations.upgrade(url, 384)
        ensure_topics(bootstrap, {topic: 4, f"{topic}.dlq": 1})
        env = {
            **os.environ,
            "KGSTREAM_HOME": str(home),
            "KGSTREAM_DATABASE_URL": url,
            "KGSTREAM_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "KGSTREAM_DOCUMENTS_TOPIC": topic,
            "KGSTREAM_DLQ_TOPIC": f"{topic}.dlq",
            "KGSTREAM_LOG_LEVEL": "WARNING",
        }
        worker = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", "worker", "indexer"], env=env, cwd=ROOT
        )
        producer = make_producer(bootstrap, Settings())
        warm = {**events[0], "event_id": "warm-up", "doc_id": "warm-up"}
        publish_events(producer, topic, [warm])
        wait_for(url, 1, 120)  # the worker has joined its group and loaded its models
        t0 = time.perf_counter()
        publish_events(producer, topic, events)
        published = time.perf_counter()
        done = wait_for(url, len(events) + 1, 1800)
        producer.close()
        return {
            "documents": len(events),
            "publish_s": round(published - t0, 2),
            "seconds": round(done - t0, 2),
            "docs_per_s": round(len(events) / (done - t0), 2),
        }
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=60)
        broker.stop()
        pg.purge()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("events", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--quick", action="store_true", help=f"first {QUICK_EVENTS} events only")
    args = parser.parse_args()
    lines = [line for line in args.events.read_text(encoding="utf-8").splitlines() if line.strip()]
    if args.quick:
        lines = lines[:QUICK_EVENTS]
    events = [json.loads(line) for line in lines]
    measured = pipeline(events)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", encoding="utf-8") as same:
        same.write("\n".join(lines) + "\n")  # the bare loop reads exactly these events
        same.flush()
        bare = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "bench_embed_extract.py"), same.name],
            capture_output=True,
            text=True,
            check=True,
        )
    loop = json.loads(bare.stdout)
    ratio = round(measured["docs_per_s"] / float(loop["passages_per_s"]), 3)
    describe = ["git", "describe", "--always", "--dirty"]
    commit = subprocess.run(describe, cwd=ROOT, capture_output=True, text=True, check=False)
    report = {
        "commit": commit.stdout.strip(),
        "pipeline": measured,
        "bare_loop": loop,
        "ratio": ratio,
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
