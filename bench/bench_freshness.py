"""Freshness: published → answerable at half the maximum rate (issue 10, deliverable 2).

Starts the embedded PostgreSQL and tansu broker, one indexer worker process and one query API
process (`kgstream worker indexer` / `worker query-api`, this checkout's code), then:

1. maximum rate: publishes a burst of documents at once and times publish → all applied;
2. steady phase: publishes one document at a time at half that rate (or ``--rate``) for at
   least ``--seconds``, timestamping each publish;
3. answerable: polls the database for the documents committed since the last look (every
   50 ms, one statement for all pending ones), then asks the query API for each one, a
   ``vector`` query (dense + BM25 over the chunks, the published read path) whose question
   is the document's title and a marker word only that document contains; the document is
   answerable when the reply's contexts include it (asked again on the next look if not).
   Polling the API itself for every pending document every 50 ms would cost a core of the
   two the indexer runs on, so the database says when to ask; the time to that first
   successful reply is counted in full.
   Walkable: the document's last ``graph_changes`` row is in the query API's held graph (its
   watermark, read from /readyz at each look): local mode walks its passages from then on.
4. the parts: each event's consumer, batch, compute, queue and write times from the
   indexer's log line (services/indexer/event_times.py), and poll = committed → answerable.

Every document is a copy of an input event with its own doc_id and event_id and the marker as
the first word of its text (bench/_freshness.py); the input is cycled when it runs short.

    .venv/bin/python bench/bench_freshness.py [--events PATH] [--quick] [--rate R]

``--quick``: a 48-document burst and 30 s at a quarter of the measured maximum.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _freshness as fr  # noqa: E402
from _scale_harness import Stack, indexer_stack, processed, wait_for  # noqa: E402

from services.indexer.event_times import PARTS, parse_parts  # noqa: E402

DEFAULT = ROOT.parent / "shared" / "data" / "hotpotqa-train100" / "events_full.jsonl"
POLL_S = 0.05
DRAIN_S = 60.0  # how long after the last publish a document may still become answerable
_COMMITTED = text(
    "SELECT event_id, outcome, extract(epoch FROM processed_at),"
    " extract(epoch FROM published_at) FROM processed_events WHERE event_id = ANY(:ids)"
    " AND outcome <> 'pending'"
)


# The last graph change each event made: its passages are walkable from the held graph once the
# API's held watermark (/readyz ``graph_memory``) has reached it.
_CHANGED = text(
    "SELECT event_id, max(id) FROM graph_changes WHERE event_id = ANY(:ids) GROUP BY event_id"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_query_api(
    stack: Stack, port: int, extra: Mapping[str, str]
) -> tuple[subprocess.Popen[bytes], httpx.Client]:
    """The query API on 127.0.0.1:port (loopback: no keys needed), ready to answer."""
    env = {**stack.env, "KGSTREAM_API_PORT": str(port), "KGSTREAM_LOG_LEVEL": "WARNING", **extra}
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "worker", "query-api"], env=env, cwd=ROOT
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if client.get("/readyz").status_code == 200:
                return proc, client
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError("the query API did not become ready in 120 s")


def answerable(client: httpx.Client, event: Mapping[str, Any], i: int) -> bool:
    """Does a vector query for the document's title and marker return the document?"""
    body = {"question": fr.question(event, i), "mode": "vector", "k": 5, "explain": False}
    reply = client.post("/v1/query", json=body)
    if reply.status_code != 200:
        return False
    return any(c["doc_id"] == event["doc_id"] for c in reply.json()["contexts"])


def max_rate(stack: Stack, docs: list[dict[str, Any]]) -> dict[str, float]:
    """Publish ``docs`` at once; documents/s from the publish to the last one applied."""
    before = processed(stack.url)
    t0 = time.perf_counter()
    stack.publish(docs)
    done = wait_for(stack.url, before + len(docs), 1800)
    return {"documents": len(docs), "docs_per_s": round(len(docs) / (done - t0), 2)}


def steady(
    stack: Stack, client: httpx.Client, docs: list[dict[str, Any]], rate: float
) -> dict[str, Any]:
    """Publish ``docs`` at ``rate`` per second and time each one to answerable."""
    n = len(docs)
    published: dict[int, float] = {}  # written by the publisher thread only
    start = time.time() + 0.5

    def publish() -> None:
        for i, doc in enumerate(docs):
            wait = fr.due(start, rate, i) - time.time()
            if wait > 0:
                time.sleep(wait)
            published[i] = time.time()
            stack.publish([doc])

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    index = {str(doc["event_id"]): i for i, doc in enumerate(docs)}
    seen = Seen(published, start, rate)
    committed, ready, not_applied = seen.committed, seen.ready, seen.not_applied
    engine = create_engine(stack.url)
    try:
        with engine.connect() as conn:
            while len(ready) + len(not_applied) < n:
                if not publisher.is_alive() and time.time() - max(published.values()) > DRAIN_S:
                    break
                waiting = [str(docs[i]["event_id"]) for i in list(published) if i not in committed]
                if waiting:
                    for event_id, outcome, at, pub in conn.execute(_COMMITTED, {"ids": waiting}):
                        committed[index[event_id]] = (
                            str(outcome),
                            float(at),
                            None if pub is None else float(pub),
                        )
                    conn.commit()
                _walkable(conn, client, docs, seen)
                for i in sorted(set(committed) - set(ready) - not_applied):
                    if committed[i][0] != "applied":
                        not_applied.add(i)  # skipped or dead-lettered: counted apart
                    elif answerable(client, docs[i], i):
                        ready[i] = time.time()
                    else:
                        seen.api_misses += 1
                time.sleep(POLL_S)
    finally:
        engine.dispose()
    publisher.join(timeout=60)
    return _result(docs, seen)


@dataclass
class Seen:
    """What the steady phase saw, per document index: when it was published (wall clock),
    committed (outcome, processed_at, the record's timestamp) and answerable."""

    published: dict[int, float]
    start: float
    rate: float
    committed: dict[int, tuple[str, float, float | None]] = field(default_factory=dict)
    ready: dict[int, float] = field(default_factory=dict)
    not_applied: set[int] = field(default_factory=set)
    api_misses: int = 0
    last_change: dict[int, int] = field(default_factory=dict)  # applied -> its last change id
    walkable: dict[int, float] = field(default_factory=dict)  # in the API's held graph


def _walkable(
    conn: Any, client: httpx.Client, docs: Sequence[Mapping[str, Any]], seen: Seen
) -> None:
    """Mark the applied documents whose last graph change the API's held graph has taken
    (its watermark from /readyz: no database read in the API)."""
    applied = [i for i, (outcome, _, _) in seen.committed.items() if outcome == "applied"]
    unknown = [str(docs[i]["event_id"]) for i in applied if i not in seen.last_change]
    if unknown:
        index = {str(docs[i]["event_id"]): i for i in applied}
        for event_id, last in conn.execute(_CHANGED, {"ids": unknown}):
            seen.last_change[index[str(event_id)]] = int(last)
        conn.commit()
    pending = [i for i in seen.last_change if i not in seen.walkable]
    if not pending:
        return
    reply = client.get("/readyz")
    held = reply.json().get("graph_memory") if reply.status_code == 200 else None
    if not held or held.get("watermark") is None:
        return
    now = time.time()
    for i in pending:
        if held["watermark"] >= seen.last_change[i]:
            seen.walkable[i] = now


def _result(docs: Sequence[Mapping[str, Any]], seen: Seen) -> dict[str, Any]:
    published, committed, ready = seen.published, seen.committed, seen.ready
    start, rate = seen.start, seen.rate
    sent = list(published.values())
    total = {str(docs[i]["event_id"]): t - published[i] for i, t in ready.items()}
    poll = {str(docs[i]["event_id"]): t - committed[i][1] for i, t in ready.items()}
    to_commit = [at - published[i] for i, (_, at, _) in committed.items()]
    late = [p - fr.due(start, rate, i) for i, p in published.items()]
    record_ts = [pub - published[i] for i, (_, _, pub) in committed.items() if pub is not None]
    return {
        "documents": len(docs),
        "published": len(sent),
        "publish_seconds": round(max(sent) - min(sent), 1) if sent else 0.0,
        "achieved_rate": round((len(sent) - 1) / (max(sent) - min(sent)), 2) if sent else 0.0,
        "publish_late_max_s": round(max(late), 3) if late else 0.0,
        "record_timestamp_minus_publish_s": fr.summary(record_ts),
        "answerable": len(ready),
        "not_applied": len(seen.not_applied),
        "never_answerable": len(docs) - len(ready) - len(seen.not_applied),
        "never_answerable_docs": [
            {"doc_id": docs[i]["doc_id"], "committed": i in committed}
            for i in sorted(set(published) - set(ready) - seen.not_applied)
        ][:20],
        "api_misses": seen.api_misses,
        "published_to_committed_s": fr.summary(to_commit),
        "published_to_answerable_s": fr.summary(list(total.values())),
        "published_to_walkable_s": fr.summary([t - published[i] for i, t in seen.walkable.items()]),
        "walkable": len(seen.walkable),
        "_total": total,
        "_poll": poll,
    }


def read_parts(log: Path) -> dict[str, dict[str, float]]:
    """Each event's parts from the worker's JSON log (its last "upsert applied" line)."""
    parts: dict[str, dict[str, float]] = {}
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and str(record.get("message", "")).startswith(
            "upsert applied ("
        ):
            parts[str(record.get("event_id"))] = parse_parts(record["message"])
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=Path, default=DEFAULT)
    parser.add_argument("--quick", action="store_true", help="48-doc burst, 30 s at max/4")
    parser.add_argument("--burst", type=int, help="documents in the max-rate burst (200)")
    parser.add_argument("--seconds", type=float, help="steady phase length (120)")
    parser.add_argument("--rate", type=float, help="steady documents/s (default: max / 2)")
    parser.add_argument(
        "--worker-env", action="append", default=[], metavar="KEY=VALUE", help="for the indexer"
    )
    parser.add_argument(
        "--api-env", action="append", default=[], metavar="KEY=VALUE", help="for the query API"
    )
    args = parser.parse_args()
    burst = args.burst or (48 if args.quick else 200)
    seconds = args.seconds or (30.0 if args.quick else 120.0)
    share = 0.25 if args.quick else 0.5
    lines = args.events.read_text(encoding="utf-8").splitlines()
    events = [e for e in (json.loads(x) for x in lines if x.strip()) if e["type"] == "upsert"]
    extra = dict(kv.split("=", 1) for kv in args.worker_env)
    api_env = dict(kv.split("=", 1) for kv in args.api_env)
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    env = {"KGSTREAM_LOG_LEVEL": "INFO", "KGSTREAM_LOG_FORMAT": "json", **extra}
    with tempfile.TemporaryDirectory(prefix="kg-freshness-") as tmp:
        log = Path(tmp) / "indexer.log"
        with indexer_stack(env=env, worker_log=log) as stack:
            api, client = start_query_api(stack, free_port(), api_env)
            try:
                stack.warm_up(events[0])
                bursts = [fr.marked(e, i, "burst") for i, e in enumerate(fr.cycle(events, burst))]
                peak = max_rate(stack, bursts)
                rate = args.rate or round(peak["docs_per_s"] * share, 2)
                n = fr.count_for(rate, seconds)
                originals = fr.cycle(events, n, offset=burst)
                docs = [fr.marked(e, i, "fresh") for i, e in enumerate(originals)]
                result = steady(stack, client, docs, rate)
            finally:
                client.close()
                api.terminate()
                api.wait(timeout=60)
                stack.stop_worker()
        parts = read_parts(log)
    total, poll = result.pop("_total"), result.pop("_poll")
    per_event = {k: {**parts.get(k, {}), "poll": poll[k]} for k in total}
    describe = ["git", "describe", "--always", "--dirty"]
    commit = subprocess.run(describe, cwd=ROOT, capture_output=True, text=True, check=False)
    report = {
        "commit": commit.stdout.strip(),
        "loadavg_before": load_before,
        "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
        "worker_env": extra,
        "api_env": api_env,
        "max_rate": peak,
        "rate": rate,
        "target": {"p50_s": 1.0, "p99_s": 3.0},
        **result,
        "events_with_parts": sum(1 for k in total if k in parts),
        "parts_s": fr.breakdown(per_event.values(), [*PARTS, "poll"]),
        "slowest_1pct_parts_mean_s": fr.slowest_share(total, per_event, 0.01),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
