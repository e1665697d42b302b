"""`kgstream demo`: the whole service on the embedded default, end to end, then shut down."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import NullPool, create_engine, text
from tqdm import tqdm

from services.cli.supervisor import Stack, running_stack
from services.core.infra.ports import free_port
from services.core.producer import make_producer, numbered_lines, publish_events, validate_line
from services.core.settings import Settings

SAMPLE = Path(__file__).resolve().parent / "sample"


def run_demo(
    settings: Settings, events: Path | None, questions: Path | None, timeout: float
) -> int:
    """Returns the process exit code."""
    events = events or SAMPLE / "events.jsonl"
    questions = questions or SAMPLE / "questions.jsonl"
    docs = []
    for number, raw in numbered_lines(events):
        event, reason = validate_line(raw, settings.max_document_bytes)
        if event is None:
            print(f"{events}:{number}: {reason}")
            return 1
        docs.append(event)
    with running_stack(settings, free_port(), child_log_level="WARNING") as stack:
        producer = make_producer(stack.endpoints.kafka_bootstrap_servers, settings)
        publish_events(producer, settings.documents_topic, docs)
        producer.close()
        print(f"published {len(docs)} document events to {settings.documents_topic}")
        _wait_indexed(stack, {str(d["event_id"]) for d in docs}, timeout)
        status = httpx.get(f"{stack.api_url}/v1/status", timeout=30).json()
        print(
            f"indexed: {status['documents']} documents, {status['chunks']} chunks, "
            f"{status['entities']} entities, {status['relationships']} relationships, "
            f"{status['dead_letters']} dead letters"
        )
        for line in questions.read_text(encoding="utf-8").splitlines()[:5]:
            _ask(stack, json.loads(line))
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
    print(f"   (reference answer: {q.get('answer')}; mode {resp['mode_used']})")
    for ctx in resp["contexts"]:
        mark = "*" if ctx["doc_id"] in gold else " "
        print(f"   {mark} {ctx['title']} [{ctx['doc_id']}] score {ctx['score']:.2f}")
