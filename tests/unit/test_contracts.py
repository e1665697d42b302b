from __future__ import annotations

import json

import pytest

from services.core.contracts import parse_document_event, schema_errors
from services.core.errors import PermanentError
from services.core.producer import validate_line

GOOD = {
    "event_id": "e1",
    "type": "upsert",
    "doc_id": "d1",
    "title": "T",
    "text": "body",
    "occurred_at": "2024-01-01T00:00:00+02:00",
}


def test_valid_event_parses() -> None:
    event = parse_document_event(json.dumps(GOOD).encode(), 10_000)
    assert event.doc_id == "d1"
    assert event.occurred_at.utcoffset() is not None


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{", "invalid_json"),
        (b"\xff\xfe", "undecodable"),
        (json.dumps({**GOOD, "type": "patch"}).encode(), "contract_violation"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "text"}).encode(), "contract_violation"),
        (json.dumps({**GOOD, "occurred_at": "2024-01-01T00:00:00"}).encode(), "contract_violation"),
        (json.dumps({**GOOD, "extra": 1}).encode(), "contract_violation"),
        (json.dumps({**GOOD, "text": "x" * 500}).encode(), "oversize"),
    ],
)
def test_bad_records_have_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(PermanentError) as info:
        parse_document_event(raw, 400)
    assert info.value.reason == reason


def test_delete_needs_no_text() -> None:
    delete = {
        "event_id": "e2",
        "type": "delete",
        "doc_id": "d1",
        "occurred_at": "2024-01-01T00:00:00Z",
    }
    assert schema_errors(delete) == []


def test_errors_name_the_field() -> None:
    errors = schema_errors({**GOOD, "version": -1})
    assert errors == ["$.version: -1 is less than the minimum of 0"]


def test_validate_line_reports_reason() -> None:
    event, reason = validate_line(b'{"event_id": 1}', 1000)
    assert event is None
    assert reason is not None
    assert reason.startswith("contract violation")
    ok, none = validate_line(json.dumps(GOOD).encode(), 1000)
    assert ok == GOOD
    assert none is None


def test_shared_sample_follows_the_contract() -> None:
    from pathlib import Path

    sample = Path(__file__).resolve().parents[2] / "services" / "cli" / "sample" / "events.jsonl"
    for line in sample.read_text(encoding="utf-8").splitlines():
        assert schema_errors(json.loads(line)) == []
