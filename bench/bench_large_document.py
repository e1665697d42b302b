"""One large document and a dozen one-line documents on other partitions (issue 18, finding 14):
how long the small ones wait while the large one is indexed.

Starts the embedded PostgreSQL and tansu broker and one indexer worker process (this
checkout's code) on a 4-partition topic, warms every partition up, then publishes one large
document (the texts of the corpus joined into one, ``--chunks`` chunks of 180 tokens) to
partition 0 and, ``--gap`` seconds later, a dozen one-line documents to partitions 1-3.
Reports each document's wait (publish → commit, from processed_events), the large document's
compute and write parts (from the worker's log line, services/indexer/event_times.py), and
whether every small document was committed before the large one.

    .venv/bin/python bench/bench_large_document.py [--chunks 900] [--small 12]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _scale_harness import Sampling, Stack, indexer_stack, wait_for  # noqa: E402

from services.core.chunking import Chunker  # noqa: E402
from services.indexer.event_times import parse_parts  # noqa: E402

CORPUS = ROOT.parent / "shared" / "data" / "hotpotqa-train100" / "events_full.jsonl"
PARTITIONS = 4
_TIMES = text(
    "SELECT event_id, extract(epoch FROM processed_at) - extract(epoch FROM published_at)"
    " FROM processed_events WHERE event_id = ANY(:ids)"
)
_ORDER = text(
    "SELECT event_id FROM processed_events WHERE event_id = ANY(:ids) ORDER BY processed_at"
)


_ACTIVITY = text(
    "SELECT extract(epoch FROM now() - xact_start), extract(epoch FROM now() - query_start),"
    " left(regexp_replace(query, '\\s+', ' ', 'g'), 70) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'"
    " AND xact_start IS NOT NULL"
)


class LongestHolds(Sampling):
    """Samples pg_stat_activity every ``interval`` s: the longest open transaction and the
    longest statement seen (its first words)."""

    def __init__(self, url: str, interval: float = 0.25) -> None:
        self.engine = create_engine(url)
        self.interval = interval
        self.transaction_s = 0.0
        self.statement = (0.0, "")

    def sample(self) -> None:
        with self.engine.connect() as conn:
            for xact, query, sql in conn.execute(_ACTIVITY).all():
                self.transaction_s = max(self.transaction_s, float(xact or 0))
                if float(query or 0) > self.statement[0]:
                    self.statement = (float(query), str(sql))

    def close(self) -> None:
        self.engine.dispose()


def large_text(chunks: int, corpus: Path) -> str:
    """The corpus's texts joined, paragraph by paragraph, until they chunk into ``chunks``."""
    chunker = Chunker(180, 30)
    paragraphs: list[str] = []
    for line in corpus.read_text(encoding="utf-8").splitlines():
        paragraphs.append(json.loads(line)["text"])
        if len(paragraphs) % 20 == 0 and len(chunker.split("\n\n".join(paragraphs))) >= chunks:
            break
    return "\n\n".join(paragraphs)


def event(event_id: str, title: str, body: str) -> dict[str, Any]:
    """An upsert whose doc_id is its event id."""
    return {
        "event_id": event_id,
        "type": "upsert",
        "doc_id": event_id,
        "title": title,
        "text": body,
        "occurred_at": "2024-01-01T00:00:00Z",
    }


def send(stack: Stack, body: dict[str, Any], partition: int) -> None:
    value = json.dumps(body).encode()
    stack.producer.send(stack.topic, value=value, key=body["doc_id"].encode(), partition=partition)
    stack.producer.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=900)
    parser.add_argument("--small", type=int, default=12)
    parser.add_argument("--gap", type=float, default=2.0, help="seconds from large to small")
    args = parser.parse_args()

    body = large_text(args.chunks, CORPUS)
    chunks = len(Chunker(180, 30).split(body))
    print(f"large document: {len(body.encode()) // 1024} KB, {chunks} chunks", flush=True)
    log = Path(tempfile.mkdtemp(prefix="kg-large-")) / "indexer.log"
    env = {"KGSTREAM_LOG_LEVEL": "INFO", "KGSTREAM_MAX_DOCUMENT_CHUNKS": str(chunks + 1)}
    with indexer_stack(partitions=PARTITIONS, env=env, worker_log=log) as stack:
        warm = event("warm", "Warm up", "Ada Lovelace wrote the first program in London.")
        used = stack.warm_up_partitions(warm)
        large = event("large", "A long compilation", body)
        small = [
            event(f"small-{i}", f"Note {i}", f"Grace Hopper {i} worked on COBOL in Arlington.")
            for i in range(args.small)
        ]
        started = time.perf_counter()
        with LongestHolds(stack.url) as holds:
            send(stack, large, 0)
            time.sleep(args.gap)
            for i, doc in enumerate(small):
                send(stack, doc, 1 + i % (PARTITIONS - 1))
            wait_for(stack.url, used + 1 + len(small), 900)
        print(f"all applied in {time.perf_counter() - started:.1f} s", flush=True)
        ids = ["large", *(d["event_id"] for d in small)]
        engine = create_engine(stack.url)
        with engine.connect() as conn:
            waits = {str(k): float(v) for k, v in conn.execute(_TIMES, {"ids": ids}).all()}
            order = [r[0] for r in conn.execute(_ORDER, {"ids": ids}).all()]
        engine.dispose()
    small_waits = sorted(float(waits[d["event_id"]]) for d in small)
    lines = log.read_text().splitlines()
    line = next((x for x in lines if "upsert applied" in x and "large" in x), "")
    print(f"large: wait {float(waits['large']):.1f} s; parts {parse_parts(line)}")
    print(
        f"small ({len(small_waits)}): min {small_waits[0]:.1f} s, median "
        f"{small_waits[len(small_waits) // 2]:.1f} s, max {small_waits[-1]:.1f} s"
    )
    print(
        f"longest transaction {holds.transaction_s:.1f} s; longest statement "
        f"{holds.statement[0]:.1f} s: {holds.statement[1]}"
    )
    before = order.index("large")
    print(f"small documents committed before the large one: {before} of {len(small)}")


if __name__ == "__main__":
    main()
