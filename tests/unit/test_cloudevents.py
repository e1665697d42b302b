"""CloudEvents 1.0 in (services/core/cloudevents.py): the envelope's validation, the type
mapping and its setting, the conversion to a native document event that then passes the
native contract, and Kafka records in binary and structured mode."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from services.core.cloudevents import (
    DEFAULT_MAPPING,
    convert,
    envelope_problems,
    is_json_media_type,
    parse_record,
    parse_type_mapping,
)
from services.core.contracts import event_problems
from services.core.errors import ConfigurationError, PermanentError
from services.core.settings import Settings

RECEIVED = datetime(2026, 11, 27, 5, 0, tzinfo=UTC)
CE: dict[str, Any] = {
    "specversion": "1.0",
    "id": "ce-1",
    "source": "https://dms.example.com/repo/7",
    "type": "com.example.dms.document.updated",
    "subject": "doc-42",
    "time": "2026-11-27T04:00:00Z",
    "datacontenttype": "application/json",
    "dmsrepo": "contracts",
    "data": {
        "title": "Lease",
        "text": "The tenant pays rent.",
        "metadata": {"folder": "/legal"},
        "acl": ["legal"],
        "tenant": "acme",
        "version": 3,
    },
}


def converted(obj: Any, max_bytes: int | None = 10_000) -> tuple[Any, list[str]]:
    return convert(obj, DEFAULT_MAPPING, RECEIVED, max_bytes)


def test_a_structured_event_becomes_a_native_one_that_passes_the_contract() -> None:
    event, problems = converted(CE)
    assert problems == []
    assert event == {
        "event_id": "ce-1",
        "type": "upsert",
        "doc_id": "doc-42",
        "occurred_at": "2026-11-27T04:00:00Z",
        "title": "Lease",
        "text": "The tenant pays rent.",
        "acl": ["legal"],
        "tenant": "acme",
        "version": 3,
        "metadata": {
            "folder": "/legal",
            "cloudevent": {
                "source": "https://dms.example.com/repo/7",
                "type": "com.example.dms.document.updated",
                "dmsrepo": "contracts",
            },
        },
    }
    assert event_problems(event, 10_000) == []


def test_facts_in_data_make_a_v2_event() -> None:
    facts = {
        "extraction": "provided",
        "entities": [
            {"name": "Acme Corp", "type": "ORG"},
            {"name": "Jane Roe", "type": "PERSON", "aliases": ["J. Roe"]},
        ],
        "relationships": [{"source": "Jane Roe", "target": "Acme Corp", "type": "WORKS_FOR"}],
    }
    event, problems = converted({**CE, "data": {**CE["data"], **facts}})
    assert problems == []
    assert event["schema_version"] == 2
    assert {name: event[name] for name in facts} == facts
    assert event_problems(event, 10_000) == []
    _, bad = converted(
        {**CE, "data": {**CE["data"], "relationships": [{"source": "X", "target": "Y"}]}}
    )
    assert bad
    assert all(p.startswith("$.data.relationships[0]") for p in bad), bad


@pytest.mark.parametrize(
    ("ce_type", "action"),
    [
        ("com.example.document.created", "upsert"),
        ("com.example.document.updated", "upsert"),
        ("com.example.document.upserted", "upsert"),
        ("com.example.document.deleted", "delete"),
        ("deleted", None),  # a suffix with its dot
        ("com.example.document.renamed", None),
        ("com.example.document.Deleted", None),  # types are case-sensitive
    ],
)
def test_default_type_mapping(ce_type: str, action: str | None) -> None:
    assert DEFAULT_MAPPING.action(ce_type) == action


def test_a_delete_needs_no_data_and_no_time_takes_the_receive_time() -> None:
    delete = {k: v for k, v in CE.items() if k not in ("data", "time", "datacontenttype")}
    event, problems = converted({**delete, "type": "com.example.document.deleted"})
    assert problems == []
    assert event["type"] == "delete"
    assert event["occurred_at"] == RECEIVED.isoformat()
    assert "text" not in event


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"specversion": "0.3"}, "$.specversion: must be \"1.0\" ('0.3')"),
        ({"specversion": None}, '$.specversion: must be "1.0" (None)'),
        ({"id": ""}, "$.id: a non-empty string is required (required by CloudEvents 1.0)"),
        ({"source": 7}, "$.source: a non-empty string is required (required by CloudEvents 1.0)"),
        ({"subject": None}, "$.subject: a non-empty string is required (the document id)"),
        ({"type": "com.example.document.renamed"}, "$.type: 'com.example.document.renamed' maps"),
        ({"datacontenttype": "text/plain"}, "$.datacontenttype: 'text/plain' is not JSON"),
        ({"data": "plain text"}, "$.data: a JSON object with the document's fields, not a str"),
        ({"data_base64": "aGk="}, "$.data_base64: binary data is not supported"),
        ({"time": 1700000000}, "$.time: an RFC 3339 timestamp string, not a number"),
        ({"Bad-Name": "x"}, "$: 'Bad-Name' is not a CloudEvents attribute name"),
        ({"dmsrepo": {"a": 1}}, "$.dmsrepo: a CloudEvents attribute is a string, integer or"),
    ],
)
def test_envelope_errors_name_the_field(change: dict[str, Any], expected: str) -> None:
    problems = envelope_problems({**CE, **change}, DEFAULT_MAPPING)
    assert any(p.startswith(expected) for p in problems), problems


def test_a_missing_attribute_is_named() -> None:
    problems = envelope_problems({"specversion": "1.0"}, DEFAULT_MAPPING)
    assert [p.split(":")[0] for p in problems] == ["$.id", "$.source", "$.type", "$.subject"]
    assert envelope_problems([CE], DEFAULT_MAPPING) == [
        "$: a CloudEvent is a JSON object, not an array"
    ]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"time": "2026-11-27T04:00:00"}, "$.time: '2026-11-27T04:00:00' does not match"),
        ({"subject": "a\nb"}, "$.subject: must not contain control characters"),
        ({"id": "x" * 600}, "$.id: "),
        ({"data": {"text": "t", "version": -1}}, "$.data.version: -1 is less than the minimum"),
        ({"data": {"text": "t", "acl": ["ok", 3]}}, "$.data.acl[1]: 3 is not of type 'string'"),
        ({"data": {"title": "no text"}}, "$.data: 'text' is a required property"),
        ({"data": {"text": "t", "body": "b"}}, "$.data.body: not a document field"),
        ({"data": {"text": "t", "metadata": {"cloudevent": 1}}}, "$.data.metadata.cloudevent:"),
        ({"dmsrepo": "a\u0000b"}, "$.dmsrepo: must not contain NUL"),
        ({"source": "s\u0000"}, "$.source: must not contain NUL"),
        ({"data": {"text": "t", "metadata": {"k": "\u0000"}}}, "$.data.metadata.k: must not"),
    ],
)
def test_native_contract_errors_are_named_as_cloudevent_fields(
    change: dict[str, Any], expected: str
) -> None:
    event, problems = converted({**CE, **change})
    assert event is None
    assert any(p.startswith(expected) for p in problems), problems


def test_the_native_size_limit_applies() -> None:
    event, problems = converted({**CE, "data": {"text": "x" * 500}}, max_bytes=400)
    assert event is None
    assert problems[0].startswith("oversize: ")


def test_structure_rules_apply_to_the_whole_envelope() -> None:
    deep: Any = "x"
    for _ in range(40):
        deep = {"a": deep}
    event, problems = converted({**CE, "data": {"text": "t", "metadata": deep}})
    assert event is None
    assert "nested deeper than 32 levels" in problems[0]
    _, surrogate = converted({**CE, "subject": "\ud800"})
    assert surrogate == ["$.subject: holds a lone surrogate (not encodable as UTF-8)"]


@pytest.mark.parametrize(
    ("spec", "checks"),
    [
        (".created=upsert,.deleted=delete", {"x.created": "upsert", "x.deleted": "delete"}),
        (" .removed = delete , .saved=upsert ", {"a.removed": "delete", "a.saved": "upsert"}),
        ("doc.deleted=delete,.deleted=upsert", {"doc.deleted": "delete", "x.deleted": "upsert"}),
        ("com.acme.gone=delete", {"com.acme.gone": "delete", "com.acme.deleted": None}),
    ],
)
def test_type_mapping_setting(spec: str, checks: dict[str, str | None]) -> None:
    mapping = parse_type_mapping(spec)
    assert {t: mapping.action(t) for t in checks} == checks
    assert parse_type_mapping(mapping.describe()) == mapping


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "maps no type"),
        (".created", "'.created' is not suffix=upsert or suffix=delete"),
        (".created=patch", "'.created=patch' is not suffix=upsert"),
        ("=upsert", "'=upsert' is not"),
        (".a=upsert,.a=delete", "names '.a' twice"),
    ],
)
def test_a_bad_type_mapping_is_refused_at_start(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match="KGSTREAM_CLOUDEVENTS_TYPES") as info:
        parse_type_mapping(spec)
    assert message in str(info.value)
    with pytest.raises(ConfigurationError, match="KGSTREAM_CLOUDEVENTS_TYPES"):
        Settings(cloudevents_types=spec)


def test_settings_default_and_override() -> None:
    assert Settings().cloudevent_types == DEFAULT_MAPPING
    custom = Settings(cloudevents_types=".saved=upsert,.purged=delete").cloudevent_types
    assert (custom.action("x.saved"), custom.action("x.purged")) == ("upsert", "delete")


@pytest.mark.parametrize(
    ("content_type", "json_type"),
    [
        ("application/json", True),
        ("application/cloudevents+json; charset=utf-8", True),
        ("Application/CloudEvents-Batch+JSON", True),
        ("text/plain", False),
        ("application/octet-stream", False),
    ],
)
def test_json_media_types(content_type: str, json_type: bool) -> None:
    assert is_json_media_type(content_type) is json_type


def binary_headers(**attributes: str) -> list[tuple[str, bytes | None]]:
    headers: list[tuple[str, bytes | None]] = [("content-type", b"application/json")]
    for name in ("specversion", "id", "source", "type", "subject", "time", "dmsrepo"):
        value = attributes.get(name, CE[name])
        if value is not None:
            headers.append((f"ce_{name}", str(value).encode()))
    return headers


def test_a_binary_mode_record_is_parsed() -> None:
    value = json.dumps(CE["data"]).encode()
    event = parse_record(value, binary_headers(), 10_000, DEFAULT_MAPPING, RECEIVED)
    assert (event.event_id, event.doc_id, event.type, event.version) == (
        "ce-1",
        "doc-42",
        "upsert",
        3,
    )
    assert event.metadata["cloudevent"]["dmsrepo"] == "contracts"
    assert event.occurred_at == datetime(2026, 11, 27, 4, 0, tzinfo=UTC)


def test_a_binary_mode_delete_may_have_no_value() -> None:
    headers = binary_headers(type="com.example.document.deleted", time=None)  # type: ignore[arg-type]
    event = parse_record(None, headers, 10_000, DEFAULT_MAPPING, RECEIVED)
    assert (event.type, event.occurred_at) == ("delete", RECEIVED)


def test_a_structured_mode_record_is_parsed() -> None:
    headers = [("content-type", b"application/cloudevents+json; charset=UTF-8")]
    event = parse_record(json.dumps(CE).encode(), headers, 10_000, DEFAULT_MAPPING, RECEIVED)
    assert event.event_id == "ce-1"


@pytest.mark.parametrize(
    ("headers", "value", "reason", "detail"),
    [
        (binary_headers(specversion="0.3"), b"{}", "contract_violation", "$.specversion"),
        (binary_headers(subject=None), b'{"text": "t"}', "contract_violation", "$.subject"),  # type: ignore[arg-type]
        (binary_headers(), b"{not json", "invalid_json", "Expecting property name"),
        ([*binary_headers(), ("ce_id", b"again")], b"{}", "contract_violation", "twice"),
        ([("ce_specversion", b"\xff")], b"{}", "undecodable", "ce_specversion"),
        (
            [*binary_headers()[1:], ("content-type", b"text/plain")],
            b"hi",
            "contract_violation",
            "'text/plain' is not JSON",
        ),
        (binary_headers(), b'{"text": "' + b"x" * 500 + b'"}', "oversize", "record is"),
    ],
)
def test_bad_kafka_cloudevents_have_a_reason(
    headers: list[tuple[str, bytes | None]], value: bytes, reason: str, detail: str
) -> None:
    with pytest.raises(PermanentError) as info:
        parse_record(value, headers, 400, DEFAULT_MAPPING, RECEIVED)
    assert info.value.reason == reason
    assert detail in info.value.detail
