from __future__ import annotations

import json

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from services.core.contracts import (
    MAX_DEPTH,
    encode_event,
    event_problems,
    parse_document_event,
    schema_errors,
)
from services.core.errors import PermanentError
from services.core.producer import max_request_size, topic_max_message_bytes, validate_line
from services.core.settings import Settings

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


# --- issue 8: the contract holds only what PostgreSQL can store, and parsing never raises ------


def _padded(size: int, **extra: object) -> bytes:
    """GOOD (plus ``extra``) with its text padded so that its wire form is ``size`` bytes."""
    base = encode_event({**GOOD, **extra, "text": ""})
    return encode_event({**GOOD, **extra, "text": "x" * (size - len(base))})


@pytest.mark.parametrize(
    "change",
    [
        {"doc_id": "nul\u0000doc"},
        {"event_id": "e\u00001"},
        {"doc_id": "tab\tdoc"},
        {"event_id": "bell\u0007"},
        {"doc_id": "del\u007f"},
        {"title": "a\u0000b"},
        {"text": "body\u0000"},
        {"tenant": "t\u0000"},
        {"acl": ["group:\u0000hr"]},
        {"metadata": {"k\u0000": 1}},
        {"metadata": {"a": [{"b": ["deep\u0000"]}]}},
        {"version": 2**63},
        {"version": 2**70},
        {"occurred_at": "2024-02-30T00:00:00Z"},
        {"occurred_at": "9999-12-31T23:59:59-23:59"},
    ],
)
def test_what_postgresql_cannot_store_is_a_contract_violation(change: dict[str, object]) -> None:
    """Failed on 47c574d: each was accepted (and dead-lettered or crashed later), and the
    February 30th raised pydantic's ValidationError out of parse_document_event."""
    raw = json.dumps({**GOOD, **change}).encode()
    with pytest.raises(PermanentError) as info:
        parse_document_event(raw, 10_000)
    assert info.value.reason == "contract_violation"
    assert event_problems({**GOOD, **change}, 10_000)
    event, reason = validate_line(raw, 10_000)
    assert event is None
    assert reason is not None
    assert reason.startswith("contract violation")


def test_largest_version_and_control_free_ids_are_valid() -> None:
    event = parse_document_event(json.dumps({**GOOD, "version": 2**63 - 1}).encode(), 10_000)
    assert event.version == 2**63 - 1
    text = parse_document_event(json.dumps({**GOOD, "text": "tabs\tand\nlines"}), 10_000)
    assert text.text == "tabs\tand\nlines"


def test_nul_message_is_short_and_names_the_field() -> None:
    problems = event_problems({**GOOD, "text": "x" * 100_000 + "\u0000"}, 1_000_000)
    assert problems == ["$.text: must not contain NUL (U+0000)"]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"event_id": "e", "metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b"[" * 100_000,
        b'{"a":' * 50_000,
        json.dumps({**GOOD, "metadata": json.loads("[" * 40 + "]" * 40)}).encode(),
    ],
)
def test_deep_nesting_is_rejected_without_recursion_error(raw: bytes) -> None:
    """Failed on 47c574d: RecursionError escaped json.loads or the schema validator."""
    with pytest.raises(PermanentError) as info:
        parse_document_event(raw, 10_000_000)
    assert info.value.reason in ("invalid_json", "contract_violation")
    assert "nested" in str(info.value)
    assert validate_line(raw, 10_000_000)[0] is None


def test_nesting_up_to_the_limit_is_valid() -> None:
    depth = MAX_DEPTH - 1  # containers: the event is level 1, metadata level 2
    metadata = json.loads('{"a":' * depth + "1" + "}" * depth)
    assert parse_document_event(json.dumps({**GOOD, "metadata": metadata}), 10_000)
    deeper = {"a": metadata}
    with pytest.raises(PermanentError):
        parse_document_event(json.dumps({**GOOD, "metadata": deeper}), 10_000)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"event_id": "e\\ud800", "type": "upsert", "doc_id": "d", "text": "t",'
        b' "occurred_at": "2024-01-01T00:00:00Z"}',
        b'{"event_id": "e", "type": "upsert", "doc_id": "d", "text": "\\udc00",'
        b' "occurred_at": "2024-01-01T00:00:00Z"}',
        b'{"event_id": "e", "type": "upsert", "doc_id": "d", "text": "t", "metadata":'
        b' {"\\ud83d": 1}, "occurred_at": "2024-01-01T00:00:00Z"}',
        b'{"event_id": "e", "type": "upsert", "doc_id": "d", "text": "t", "metadata":'
        b' {"x": NaN}, "occurred_at": "2024-01-01T00:00:00Z"}',
        b'{"event_id": "e", "type": "upsert", "doc_id": "d", "text": "t", "metadata":'
        b' {"x": 1e400}, "occurred_at": "2024-01-01T00:00:00Z"}',
        b"\x00\x00\x00",
        b'"\\ud800"',
    ],
)
def test_lone_surrogates_and_non_finite_numbers_are_rejected(raw: bytes) -> None:
    """Failed on 47c574d: a lone surrogate was accepted (UnicodeEncodeError later)."""
    with pytest.raises(PermanentError) as info:
        parse_document_event(raw, 10_000)
    assert info.value.reason in ("invalid_json", "contract_violation")
    event, reason = validate_line(raw, 10_000)
    assert event is None
    assert reason is not None


def test_a_paired_surrogate_escape_is_fine() -> None:
    raw = json.dumps({**GOOD, "title": "\U0001f600"}, ensure_ascii=True).encode()
    assert parse_document_event(raw, 10_000).title == "\U0001f600"


@pytest.mark.parametrize("limit", [400, 10_000, 1_000_000])
def test_size_edges(limit: int) -> None:
    """Exactly at the limit is valid; one byte more is oversize: in the indexer's decoder, in
    `kgstream publish` validation and in HTTP ingest (which counts the wire form)."""
    at, over = _padded(limit), _padded(limit + 1)
    assert (len(at), len(over)) == (limit, limit + 1)
    assert parse_document_event(at, limit).doc_id == "d1"
    with pytest.raises(PermanentError) as info:
        parse_document_event(over, limit)
    assert info.value.reason == "oversize"
    assert validate_line(at, limit)[0] is not None
    assert (validate_line(over, limit)[1] or "").startswith("oversize")
    assert event_problems(json.loads(at), limit) == []
    assert event_problems(json.loads(over), limit)[0].startswith("oversize")


@pytest.mark.parametrize("max_document_bytes", [1, 1000, 1_000_000, 1_044_000, 3_000_000])
def test_every_valid_event_fits_the_producer(max_document_bytes: int) -> None:
    """The largest valid event, keyed by the longest doc_id (512 four-byte characters), fits
    kafka-python's size estimate for a one-record batch under ``max_request_size``; and topics
    we create accept it. On 47c574d a 2 MB event passed validation and could not be sent."""
    settings = Settings(max_document_bytes=max_document_bytes)
    key = ("\U0001f600" * 512).encode()
    value = b"x" * max_document_bytes
    needed = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, [])
    assert needed <= max_request_size(settings)
    assert max_request_size(settings) >= 1_048_576
    assert topic_max_message_bytes(settings) >= max_request_size(settings)


def test_default_document_limit_fits_kafkas_default_message_limit() -> None:
    settings = Settings()
    assert settings.max_document_bytes == 1_000_000
    assert max_request_size(settings) == 1_048_576
    assert topic_max_message_bytes(settings) == 1_048_588  # Kafka's message.max.bytes default


def test_a_line_over_the_limit_after_reencoding_is_oversize() -> None:
    """`kgstream publish` sends the wire form: a line that grows when re-encoded (1e2 becomes
    100.0) is measured as sent."""
    line = json.dumps({**GOOD, "metadata": {"n": [1e2] * 50}}, separators=(",", ":")).encode()
    grown = len(line.replace(b"100.0", b"1e2"))
    compact = line.replace(b"100.0", b"1e2")
    assert grown < len(line)
    event, reason = validate_line(compact, grown)
    assert event is None
    assert (reason or "").startswith("oversize")


@pytest.mark.parametrize("schema_version", [1, 2])
def test_an_acl_has_bounds(schema_version: int) -> None:
    """Issue 30: an unbounded ACL overflowed a database index and stalled the indexer. The
    contract now bounds it (1,000 groups of at most 256 characters), refused with the field."""
    versioned = {**GOOD, "schema_version": schema_version} if schema_version == 2 else GOOD
    assert event_problems({**versioned, "acl": [f"g{i}" for i in range(1000)]}, 1_000_000) == []
    too_many = event_problems({**versioned, "acl": [f"g{i}" for i in range(1001)]}, 1_000_000)
    assert too_many
    assert "acl" in too_many[0]
    too_long = event_problems({**versioned, "acl": ["g" * 257]}, 1_000_000)
    assert too_long
    assert "acl" in too_long[0]
