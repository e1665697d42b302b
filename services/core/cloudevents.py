"""CloudEvents 1.0 in: a CloudEvent becomes a native document event (schemas/
document_event.v1.json), which then goes through the native contract (services/core/contracts.py)
like any other. No framework here: HTTP ingest and the indexer both call it.

Formats read: the JSON event format (HTTP structured mode ``application/cloudevents+json``,
batch mode ``application/cloudevents-batch+json``, Kafka structured mode) and the Kafka
binding's binary mode (``ce_*`` headers, the record value is ``data``).

The mapping (docs/ingest.md, "CloudEvents"): ``id`` -> event_id, ``subject`` -> doc_id (required
here: it is the document's identity), ``time`` -> occurred_at (absent: the time it was
received), ``type`` -> upsert or delete by ``TypeMapping`` (KGSTREAM_CLOUDEVENTS_TYPES),
``data`` (a JSON object) -> title, text, metadata, acl, tenant, version. The other attributes
(``source``, ``type``, ``dataschema`` and every extension) are kept in the native event's
``metadata.cloudevent``. Errors name the CloudEvent's fields (``$.subject``, ``$.data.text``),
not the native ones they became."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import Message
from typing import Any, Literal

from services.core.contracts import (
    DocumentEvent,
    decode_json,
    encode_event,
    event_problems,
    parse_document_event,
    structure_errors,
)
from services.core.errors import ConfigurationError, PermanentError
from services.core.facts import FIELDS as FACT_FIELDS

STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
SPECVERSION = "1.0"
HEADER_PREFIX = "ce_"
METADATA_KEY = "cloudevent"
DEFAULT_TYPES = ".created=upsert,.updated=upsert,.upserted=upsert,.deleted=delete"
# The document's fields, and the facts its publisher knows (a v2 event: services/core/facts.py).
DATA_FIELDS = ("title", "text", "metadata", "acl", "tenant", "version", *FACT_FIELDS)
# Context attributes that become native fields (the rest is kept in metadata.cloudevent).
_MAPPED = frozenset({"specversion", "id", "subject", "time", "datacontenttype", "data"})
_NAME = re.compile(r"^[a-z0-9]+$")  # CloudEvents 1.0: attribute names are [a-z0-9]
# Native field -> the CloudEvent field it came from, for error messages.
_NATIVE_PATHS = {
    "$.event_id": "$.id",
    "$.doc_id": "$.subject",
    "$.occurred_at": "$.time",
    "$.type": "$.type",
    **{f"$.{name}": f"$.data.{name}" for name in DATA_FIELDS},
}
Action = Literal["upsert", "delete"]
Headers = Sequence[tuple[str, bytes | None]]


def media_type(content_type: str | None) -> str:
    """The media type of a Content-Type value, lowercase, without parameters."""
    message = Message()
    message["content-type"] = content_type or ""
    return message.get_content_type()


def is_json_media_type(content_type: str) -> bool:
    """application/json or any application/*+json media type (parameters ignored)."""
    main, _, sub = media_type(content_type).partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


@dataclass(frozen=True)
class TypeMapping:
    """CloudEvent ``type`` -> action, by the longest matching suffix."""

    rules: tuple[tuple[str, Action], ...]

    def action(self, ce_type: str) -> Action | None:
        """The action of the longest suffix ``ce_type`` ends with; None when none does."""
        for suffix, action in self.rules:
            if ce_type.endswith(suffix):
                return action
        return None

    def describe(self) -> str:
        """The mapping as KGSTREAM_CLOUDEVENTS_TYPES spells it."""
        return ",".join(f"{suffix}={action}" for suffix, action in self.rules)


def parse_type_mapping(spec: str) -> TypeMapping:
    """KGSTREAM_CLOUDEVENTS_TYPES: comma-separated ``suffix=action`` pairs (action ``upsert``
    or ``delete``; a suffix may be a whole type); ConfigurationError naming the setting."""
    rules: dict[str, Action] = {}
    for part in spec.split(","):
        suffix, sep, action = (p.strip() for p in part.partition("="))
        if not part.strip():
            continue
        if not sep or not suffix or action not in ("upsert", "delete"):
            raise ConfigurationError(
                f"KGSTREAM_CLOUDEVENTS_TYPES: {part.strip()!r} is not suffix=upsert or "
                f"suffix=delete (the default is {DEFAULT_TYPES!r})"
            )
        if suffix in rules:
            raise ConfigurationError(f"KGSTREAM_CLOUDEVENTS_TYPES names {suffix!r} twice")
        rules[suffix] = "upsert" if action == "upsert" else "delete"
    if not rules:
        raise ConfigurationError(
            f"KGSTREAM_CLOUDEVENTS_TYPES maps no type (the default is {DEFAULT_TYPES!r})"
        )
    ordered = sorted(rules.items(), key=lambda rule: -len(rule[0]))
    return TypeMapping(tuple(ordered))


DEFAULT_MAPPING = parse_type_mapping(DEFAULT_TYPES)


def envelope_problems(obj: object, types: TypeMapping) -> list[str]:
    """Why ``obj`` (a decoded JSON value) is not a CloudEvent 1.0 in the JSON format that
    kgstream can map; empty when it is one. The native contract is checked after conversion."""
    if not isinstance(obj, dict):
        return [f"$: a CloudEvent is a JSON object, not {_json_type(obj)}"]
    problems = structure_errors(obj)
    if problems:
        return problems
    if obj.get("specversion") != SPECVERSION:
        got = "missing" if "specversion" not in obj else repr(obj["specversion"])
        problems.append(f'$.specversion: must be "{SPECVERSION}" ({got})')
    for name in ("id", "source", "type", "subject"):
        value = obj.get(name)
        if not isinstance(value, str) or not value:
            what = "the document id" if name == "subject" else "required by CloudEvents 1.0"
            problems.append(f"$.{name}: a non-empty string is required ({what})")
    if isinstance(obj.get("type"), str) and obj["type"] and types.action(obj["type"]) is None:
        problems.append(
            f"$.type: {_quoted(obj['type'])} maps to neither upsert nor delete "
            f"(KGSTREAM_CLOUDEVENTS_TYPES={types.describe()})"
        )
    if "time" in obj and not isinstance(obj["time"], str):
        problems.append(f"$.time: an RFC 3339 timestamp string, not {_json_type(obj['time'])}")
    content_type = obj.get("datacontenttype")
    if content_type is not None and not (
        isinstance(content_type, str) and is_json_media_type(content_type)
    ):
        problems.append(
            f"$.datacontenttype: {_quoted(content_type)} is not JSON (application/json or "
            "application/*+json)"
        )
    if "data_base64" in obj:
        problems.append("$.data_base64: binary data is not supported: send data as a JSON object")
    problems += _data_problems(obj.get("data"))
    for name, value in obj.items():
        if not _NAME.match(name) and name != "data_base64":
            problems.append(f"$: {_quoted(name)} is not a CloudEvents attribute name ([a-z0-9]+)")
        elif name not in _MAPPED and not isinstance(value, str | int | bool):
            problems.append(
                f"$.{name}: a CloudEvents attribute is a string, integer or boolean, "
                f"not {_json_type(value)}"
            )
    return problems


def _data_problems(data: object) -> list[str]:
    if data is None:
        return []  # a delete needs no data; an upsert misses its text (native contract)
    if not isinstance(data, dict):
        return [f"$.data: a JSON object with the document's fields, not {_json_type(data)}"]
    problems = [
        f"$.data.{name}: not a document field ({', '.join(DATA_FIELDS)})"
        for name in data
        if name not in DATA_FIELDS
    ]
    metadata = data.get("metadata")
    if isinstance(metadata, dict) and METADATA_KEY in metadata:
        problems.append(
            f"$.data.metadata.{METADATA_KEY}: reserved for the CloudEvent's own attributes"
        )
    return problems


def to_native(obj: Mapping[str, Any], types: TypeMapping, received: datetime) -> dict[str, Any]:
    """The native document event of a CloudEvent that passed ``envelope_problems``.
    ``received``: its occurred_at when it has no ``time``."""
    action = types.action(obj["type"])
    event: dict[str, Any] = {
        "event_id": obj["id"],
        "type": action,
        "doc_id": obj["subject"],
        "occurred_at": obj.get("time", received.astimezone(UTC).isoformat()),
    }
    data = obj.get("data") or {}
    event.update({name: data[name] for name in DATA_FIELDS if name in data})
    if any(name in data for name in FACT_FIELDS):
        event["schema_version"] = 2  # the facts are v2's
    kept = {name: value for name, value in obj.items() if name not in _MAPPED}
    metadata = data.get("metadata", {})
    if isinstance(metadata, dict):  # else left for the native contract to name
        event["metadata"] = {**metadata, METADATA_KEY: kept}
    return event


def native_problems(event: Mapping[str, Any], max_bytes: int | None) -> list[str]:
    """The native contract's problems of a converted event, named as CloudEvent fields."""
    return [_as_cloudevent_path(p) for p in event_problems(event, max_bytes)]


def _as_cloudevent_path(problem: str) -> str:
    path, sep, message = problem.partition(": ")
    if not sep or not path.startswith("$"):
        return problem
    if path == "$":
        return f"$.data: {message}"  # e.g. 'text' is a required property (an upsert)
    kept = f"$.metadata.{METADATA_KEY}"
    if path.startswith(kept + ".") or path.startswith(kept + "["):
        return f"${path[len(kept) :]}: {message}"  # an attribute kept from the envelope
    head, dot, rest = path[2:].partition(".")
    bracket = head.find("[")
    name = head if bracket < 0 else head[:bracket]
    mapped = _NATIVE_PATHS.get(f"$.{name}")
    if mapped is None:
        return problem
    return f"{mapped}{head[len(name) :]}{dot}{rest}: {message}"


def convert(
    obj: object, types: TypeMapping, received: datetime, max_bytes: int | None
) -> tuple[dict[str, Any] | None, list[str]]:
    """(native event, []) for a valid CloudEvent, else (None, problems)."""
    problems = envelope_problems(obj, types)
    if problems or not isinstance(obj, dict):
        return None, problems
    event = to_native(obj, types, received)
    problems = native_problems(event, max_bytes)
    return (None, problems) if problems else (event, [])


def header_text(headers: Headers, name: str) -> str | None:
    """The first header ``name`` (case-insensitive) as text; None when absent."""
    for key, value in headers:
        if key.lower() == name:
            return (value or b"").decode("utf-8", "replace")
    return None


def is_binary_mode(headers: Headers) -> bool:
    """A Kafka record in the binding's binary mode: it has a ``ce_specversion`` header."""
    return any(key.lower() == HEADER_PREFIX + "specversion" for key, _ in headers)


def is_structured_mode(headers: Headers) -> bool:
    """A Kafka record in structured mode: its content-type is application/cloudevents+json."""
    return media_type(header_text(headers, "content-type")) == STRUCTURED


def from_binary(headers: Headers, value: bytes | None) -> dict[str, Any]:
    """The CloudEvent of a binary-mode Kafka record in the JSON format (attributes from the
    ``ce_`` headers, ``datacontenttype`` from ``content-type``, ``data`` from the value);
    PermanentError when a header is not UTF-8, appears twice, or the value is not JSON."""
    obj: dict[str, Any] = {}
    for key, raw in headers:
        name = key.lower()
        if name == "content-type":
            name = "datacontenttype"
        elif name.startswith(HEADER_PREFIX):
            name = name[len(HEADER_PREFIX) :]
        else:
            continue
        if name in obj:
            raise PermanentError("contract_violation", f"CloudEvent: header {key!r} appears twice")
        try:
            obj[name] = (raw or b"").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PermanentError("undecodable", f"CloudEvent: header {key!r}: {exc}") from exc
    content_type = obj.get("datacontenttype")
    if content_type is not None and not is_json_media_type(content_type):
        detail = f"CloudEvent: content-type {_quoted(content_type)} is not JSON"
        raise PermanentError("contract_violation", detail)
    if value:
        obj["data"] = decode_json(value)
    return obj


def parse_record(
    value: bytes | None,
    headers: Headers,
    max_bytes: int,
    types: TypeMapping,
    received: datetime,
) -> DocumentEvent:
    """A Kafka record in binary or structured mode as a validated document event;
    PermanentError with the reason otherwise (reasons as for native records)."""
    size = len(value or b"")
    if size > max_bytes:
        raise PermanentError("oversize", f"record is {size} bytes; the limit is {max_bytes}")
    obj = from_binary(headers, value) if is_binary_mode(headers) else decode_json(value or b"")
    event, problems = convert(obj, types, received, max_bytes)
    if event is None:
        detail = "CloudEvent: " + "; ".join(problems)
        if problems[0].startswith("oversize"):
            raise PermanentError("oversize", detail)
        raise PermanentError("contract_violation", detail)
    return parse_document_event(encode_event(event), max_bytes)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _quoted(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "…"
