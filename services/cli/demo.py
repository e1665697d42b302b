"""`kgstream demo`: the whole service on the embedded default, end to end, then shut down:
publish the sample, wait until it is indexed, answer sample questions (local mode), ask the
communities worker for a snapshot of the indexed graph and show it (communities by level, the
change ratio against the threshold), then answer one global question from it.

The demo's communities worker checks every 2 s with 5 s between recomputes (defaults 10 s and
30 s) unless KGSTREAM_COMMUNITIES_CHECK_INTERVAL_S / _MIN_INTERVAL_S are set."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
from sqlalchemy import NullPool, create_engine, text
from sqlalchemy.ext.asyncio import AsyncEngine
from tqdm import tqdm

from services.cli.supervisor import Stack, running_stack
from services.communities.requests import request_recompute, wait_for_answer
from services.core.db.engine import make_engine
from services.core.infra.ports import free_port
from services.core.producer import make_producer, numbered_lines, publish_events, validate_line
from services.core.settings import Settings

T = TypeVar("T")
SAMPLE = Path(__file__).resolve().parent / "sample"
# The sample's films, songs and people of that year (issue 31: time-scoped facts).
FACTS_YEAR = 1986
GLOBAL_QUESTION = "What are the main themes of these documents?"
DEMO_ENV = {
    "KGSTREAM_COMMUNITIES_CHECK_INTERVAL_S": "2",
    "KGSTREAM_COMMUNITIES_MIN_INTERVAL_S": "5",
    # Like its API port, the demo's metrics ports are any free ones: it runs beside `kgstream up`.
    "KGSTREAM_INDEXER_METRICS_PORT": "0",
    "KGSTREAM_COMMUNITIES_METRICS_PORT": "0",
}


def run_demo(
    settings: Settings,
    events: Path | None,
    questions: Path | None,
    timeout: float,
    snapshot_timeout: float = 180,
) -> int:
    """Returns the process exit code (1 when no snapshot is published in ``snapshot_timeout``
    seconds)."""
    events = events or SAMPLE / "events.jsonl"
    questions = questions or SAMPLE / "questions.jsonl"
    docs = []
    for number, raw in numbered_lines(events):
        event, reason = validate_line(raw, settings.max_document_bytes)
        if event is None:
            print(f"{events}:{number}: {reason}")
            return 1
        docs.append(event)
    extra_env = {k: v for k, v in DEMO_ENV.items() if k not in os.environ}
    with running_stack(
        settings, free_port(), child_log_level="WARNING", extra_env=extra_env
    ) as stack:
        producer = make_producer(stack.endpoints.kafka_bootstrap_servers, settings)
        publish_events(producer, settings.documents_topic, docs)
        producer.close()
        print(f"published {len(docs)} document events to {settings.documents_topic}")
        _wait_indexed(stack, {str(d["event_id"]) for d in docs}, timeout)
        # What `kgstream recompute` does; the snapshot that answers covers everything indexed.
        requested_at = _on_database(stack, request_recompute)
        status = httpx.get(f"{stack.api_url}/v1/status", timeout=30).json()
        print(
            f"indexed: {status['documents']} documents, {status['chunks']} chunks, "
            f"{status['entities']} entities, {status['relationships']} relationships, "
            f"{status['dead_letters']} dead letters"
        )
        print(
            f"graph explorer: {stack.api_url}/explorer (while the demo runs; `kgstream up` "
            f"serves it at http://127.0.0.1:{settings.api_port}/explorer)"
        )
        for line in questions.read_text(encoding="utf-8").splitlines()[:5]:
            _ask(stack, json.loads(line))
        _what_held(stack, FACTS_YEAR)
        print(f"\nwaiting for the communities worker's snapshot (at most {snapshot_timeout:.0f}s)")
        answer = _on_database(stack, lambda e: wait_for_answer(e, requested_at, snapshot_timeout))
        if answer is None or answer.status == "failed":
            what = "failed" if answer else f"was not published within {snapshot_timeout:.0f}s"
            print(
                f"\nthe community snapshot {what}: global questions cannot be answered yet "
                "(the communities worker's log says why; run the demo with "
                "KGSTREAM_LOG_LEVEL=INFO to see it)"
            )
            return 1
        _show_snapshot(stack, settings.recompute_threshold)
        _ask_global(stack, GLOBAL_QUESTION)
    print("demo finished; everything is stopped")
    return 0


def _wait_indexed(stack: Stack, event_ids: set[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    ids = sorted(event_ids)
    engine = create_engine(stack.endpoints.database_url, poolclass=NullPool)
    with tqdm(total=len(event_ids), desc="indexing", unit="doc") as bar:
        done = 0
        while done < len(event_ids):
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {done}/{len(event_ids)} events indexed in {timeout:.0f}s")
            stack.check_alive()
            with engine.connect() as conn:
                now = int(
                    conn.scalar(
                        text("SELECT count(*) FROM processed_events WHERE event_id = ANY(:ids)"),
                        {"ids": ids},
                    )
                    or 0
                )
            bar.update(now - done)
            done = now
            time.sleep(0.5)


def _ask(stack: Stack, q: dict[str, Any]) -> None:
    body = {"question": q["question"], "mode": "local", "k": 3}
    resp = httpx.post(f"{stack.api_url}/v1/query", json=body, timeout=60).json()
    gold = set(q.get("gold_doc_ids", []))
    print(f"\nQ: {q['question']}")
    print(f"A: {resp['answer']}")
    if resp.get("support"):
        print(f"   from: {resp['support']}")
    print(f"   (reference answer: {q.get('answer')}; mode {resp['mode_used']})")
    for ctx in resp["contexts"]:
        mark = "*" if ctx["doc_id"] in gold else " "
        print(f"   {mark} {ctx['title']} [{ctx['doc_id']}] score {ctx['score']:.2f}")


def _what_held(stack: Stack, year: int) -> None:
    """A time-scoped question of the graph: the facts that held during ``year``."""
    params = {"from": f"{year}-01-01", "to": f"{year}-12-31", "limit": "5"}
    resp = httpx.get(f"{stack.api_url}/v1/facts", params=params, timeout=60)
    print(f"\nWhat held in {year}? (GET /v1/facts?from={year}-01-01&to={year}-12-31)")
    found = resp.json().get("facts", []) if resp.status_code == 200 else []
    if not found:
        print(f"   nothing the documents date to {year} ({resp.status_code})")
    for fact in found:
        span = f"{fact['valid_from'] or '...'} to {fact['valid_to'] or '...'}"
        print(f"   [{fact['expression']}: {span}) {fact['sentence'][:110]} [{fact['doc_id']}]")


def _on_database(stack: Stack, work: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    """Run ``work`` on an engine for the stack's database, disposed afterwards."""

    async def go() -> T:
        engine = make_engine(stack.endpoints.database_url)
        try:
            return await work(engine)
        finally:
            await engine.dispose()

    return asyncio.run(go())


def _show_snapshot(stack: Stack, threshold: float) -> None:
    status = httpx.get(f"{stack.api_url}/v1/status", timeout=30).json()
    snap = status["snapshot"]
    engine = create_engine(stack.endpoints.database_url, poolclass=NullPool)
    with engine.connect() as conn:
        by_level = conn.execute(
            text(
                "SELECT level, count(*) AS n FROM communities WHERE snapshot_id = :id"
                " GROUP BY level ORDER BY level"
            ),
            {"id": snap["id"]},
        ).all()
    engine.dispose()
    levels = ", ".join(f"level {row.level}: {row.n}" for row in by_level)
    print(
        f"community snapshot {snap['id']} published: {snap['communities']} communities "
        f"({levels}); reports: {snap['reports_generated']} written, "
        f"{snap['reports_reused']} reused"
    )
    ratio = status["change_ratio"]
    side = "above" if ratio > threshold else "at or below"
    print(f"change ratio since it: {ratio:.3f}, {side} the recompute threshold {threshold:.2f}")


def _ask_global(stack: Stack, question: str) -> None:
    body = {"question": question, "mode": "global", "k": 3}
    resp = httpx.post(f"{stack.api_url}/v1/query", json=body, timeout=60).json()
    print(f"\nQ (global): {question}")
    print(f"A: {resp['answer']}")
    if resp.get("support"):
        print(f"   from: {resp['support']}")
    print(f"   (mode {resp['mode_used']}, snapshot {resp['snapshot_id']})")
    for c in resp["communities"]:
        print(f"   community {c['id']} (level {c['level']}, {c['size']} entities): {c['title']}")
    for ctx in resp["contexts"]:
        print(f"     {ctx['title']} [{ctx['doc_id']}] score {ctx['score']:.2f}")
