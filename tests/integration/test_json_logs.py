"""KGSTREAM_LOG_FORMAT=json on a real indexer worker: every line it writes is one JSON object
(faust's own lines included), the lines about an event carry its event_id and doc_id, and an
orderly SIGTERM leaves no traceback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from services.core.settings import Settings
from tests.support.graph import wait_processed
from tests.support.workers import publish_lines, start_worker, wait_ready

pytestmark = pytest.mark.integration

EVENTS = [
    {
        "event_id": f"json-log-{n}",
        "type": "upsert",
        "doc_id": f"json-doc-{n}",
        "title": title,
        "text": text,
        "occurred_at": "2024-01-01T00:00:00Z",
    }
    for n, (title, text) in enumerate(
        [
            ("Marie Curie", "Marie Curie worked in Paris with Pierre Curie."),
            ("Ada Lovelace", "Ada Lovelace wrote about the Analytical Engine of Charles Babbage."),
        ]
    )
]


def test_json_logs_of_an_indexer_worker(settings: Settings, tmp_path: Path) -> None:
    worker = start_worker(settings, tmp_path / "indexer.log", log_format="json")
    try:
        assert wait_ready([worker]), worker.output()[-3000:]
        bad = {"doc_id": "json-bad", "type": "upsert"}  # a contract violation: dead-lettered
        lines = [json.dumps(e) for e in [*EVENTS, bad]]
        publish_lines(str(settings.kafka_bootstrap_servers), settings.documents_topic, lines)
        assert wait_processed(str(settings.database_url), len(EVENTS)) == len(EVENTS)
        deadline = time.monotonic() + 60
        while "dead-lettered" not in worker.output() and time.monotonic() < deadline:
            time.sleep(0.2)
        worker.proc.terminate()
        assert worker.proc.wait(timeout=60) == 0
    finally:
        worker.stop()
    output = worker.output()
    assert "Traceback" not in output, output[-3000:]
    records = [json.loads(line) for line in output.splitlines()]  # each line parses alone
    assert all(isinstance(r, dict) for r in records)
    for r in records:
        assert {"ts", "level", "logger", "message", "process", "pid"} <= r.keys(), r
        assert r["process"] == "indexer"
    # faust's own records come through the same handler
    assert any(r["logger"].startswith("faust") and "Ready" in r["message"] for r in records)
    for event in EVENTS:
        about = [r for r in records if r.get("event_id") == event["event_id"]]
        assert about, f"no line carries {event['event_id']}"
        assert all(r["doc_id"] == event["doc_id"] for r in about)
        assert any(r["message"].startswith("upsert applied (") for r in about)
    assert any(r["level"] == "WARNING" and "dead-lettered" in r["message"] for r in records)
