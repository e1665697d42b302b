"""Publish with the CLI, index with a real indexer process on the real broker, then query."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from services.core.settings import Settings
from tests.support.cli import env_for, kgstream

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "services" / "cli" / "sample"


@pytest.fixture
def indexer(settings: Settings) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "worker", "indexer"], env=env_for(settings)
    )
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def wait_processed(url: str, n: int, timeout: float = 180) -> int:
    engine = create_engine(url)
    deadline = time.monotonic() + timeout
    done = 0
    try:
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                done = int(conn.scalar(text("SELECT count(*) FROM processed_events")) or 0)
            if done >= n:
                break
            time.sleep(0.5)
    finally:
        engine.dispose()
    return done


def test_publish_index_query(
    settings: Settings, indexer: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    questions = [json.loads(line) for line in (SAMPLE / "questions.jsonl").read_text().splitlines()]
    q = questions[0]
    lines = (SAMPLE / "events.jsonl").read_text(encoding="utf-8").splitlines()
    gold = [e for e in lines if json.loads(e)["doc_id"] in q["gold_doc_ids"]]
    events = [e for e in lines if e not in gold][:18] + gold
    bad = [
        '{"event_id": "x1", "type": "upsert"}',  # no doc_id, no text
        "not json at all",
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join([*events[:10], bad[0], *events[10:], bad[1]]) + "\n")

    published = kgstream(settings, "publish", str(path))
    assert published.returncode == 1, published.stderr
    assert "line 11: contract violation" in published.stderr
    assert "line 22: invalid JSON" in published.stderr
    assert "sent 20, rejected 2" in published.stdout

    assert wait_processed(str(settings.database_url), 20) == 20

    status = kgstream(settings, "status", "--json")
    assert status.returncode == 0, status.stderr
    counts = json.loads(status.stdout)
    assert counts["documents"] == 20
    assert counts["chunks"] >= 20
    assert counts["entities"] > 0
    assert counts["relationships"] > 0

    for mode in ("vector", "local"):
        result = kgstream(settings, "query", q["question"], "--mode", mode, "--k", "5", "--json")
        assert result.returncode == 0, result.stderr
        body = json.loads(result.stdout)
        assert body["mode_used"] == mode
        assert {"doc_id", "chunk_id", "score", "text"} <= set(body["contexts"][0])
        assert set(q["gold_doc_ids"]) & {c["doc_id"] for c in body["contexts"]}


def test_the_indexer_applies_a_curation_made_from_the_cli(
    settings: Settings, indexer: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """The worker's timer (KGSTREAM_CURATION_APPLY_INTERVAL_S, 5 s) resolves the stored
    documents again: nobody runs `curate apply`."""
    at = "2024-01-01T00:00:00Z"
    events = [
        {"event_id": "z1", "type": "upsert", "doc_id": "zedong", "title": "Chinese Revolution",
         "text": "The leader Mao Zedong founded the state.", "occurred_at": at},
        {"event_id": "n1", "type": "upsert", "doc_id": "nixon", "title": "Diplomacy",
         "text": "In 1972 Mao met Richard Nixon in Beijing.", "occurred_at": at},
    ]  # fmt: skip
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert kgstream(settings, "publish", str(path)).returncode == 0
    url = str(settings.database_url)
    assert wait_processed(url, 2) == 2
    made = kgstream(settings, "curate", "merge", "Mao Zedong", "Mao")
    assert made.returncode == 0, made.stderr
    owner = (
        "SELECT e.name FROM mentions m JOIN entities e ON e.id = m.entity_id"
        " WHERE m.doc_id = 'nixon' AND m.surface = 'Mao'"
    )
    engine = create_engine(url)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                pending = conn.scalar(
                    text("SELECT count(*) FROM curations WHERE applied_at IS NULL")
                )
                name = conn.scalar(text(owner))
            if pending == 0:
                break
            time.sleep(0.5)
    finally:
        engine.dispose()
    assert (pending, name) == (0, "Mao Zedong")
