"""Wire contracts: the JSON Schemas in ``schemas/`` are the source of truth; this module loads
them, validates raw records against them and turns valid ones into typed events.

Three rules of the document event contract cannot be written in JSON Schema and are checked
here, before the schema (so that neither ``json.loads`` nor the validator can recurse without
bound): the whole event nests at most ``MAX_DEPTH`` levels, no string holds a lone surrogate
(it has no UTF-8 form, so PostgreSQL could not store it) and every number is finite."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, Literal

from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.core.errors import PermanentError
from services.core.facts import (
    FIELDS,
    Extraction,
    ProvidedEntity,
    ProvidedRelationship,
    fact_problems,
    stored_form,
)

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"
MAX_DEPTH = 32  # objects and arrays, the event itself counting as 1
_MESSAGE_CHARS = 300  # jsonschema messages quote the instance: a 1 MB text would be quoted whole
_PATTERN_MESSAGES = {
    "^[^\\u0000]*$": "must not contain NUL (U+0000)",
    "^[^\\u0000-\\u001f\\u007f]*$": "must not contain control characters (U+0000-U+001F, U+007F)",
}


@cache
def validator(name: str) -> Draft202012Validator:
    """The validator for ``schemas/<name>.json`` (e.g. ``document_event.v1``)."""
    schema = json.loads((SCHEMA_DIR / f"{name}.json").read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


# schema_version -> the schema that validates it; absent means 1. v2 is v1 plus the facts the
# publisher already knows (services/core/facts.py): every v1 event stays valid as it is.
SCHEMAS = {1: "document_event.v1", 2: "document_event.v2"}


class DocumentEvent(BaseModel):
    """A document event (v1 or v2) after validation (internal, typed form of the wire object).
    A v1 event has no facts and extracts as usual."""

    model_config = ConfigDict(frozen=True)

    event_id: str
    type: Literal["upsert", "delete"]
    doc_id: str
    version: int | None = None
    title: str = ""
    text: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    acl: list[str] | None = None
    tenant: str | None = None
    occurred_at: datetime
    extraction: Extraction = "auto"
    entities: tuple[ProvidedEntity, ...] = ()
    relationships: tuple[ProvidedRelationship, ...] = ()

    def facts(self) -> str | None:
        """The provided facts as the documents row keeps them; None when there are none and
        the text is extracted as usual (services/core/facts.py ``stored_form``)."""
        return stored_form(self.extraction, self.entities, self.relationships)


def schema_errors(obj: object, schema: str = "document_event.v1") -> list[str]:
    """Every violation of ``schema`` in ``obj`` as '<json path>: <message>', sorted by path."""
    errors = sorted(validator(schema).iter_errors(obj), key=lambda e: list(map(str, e.path)))
    return [f"{e.json_path}: {_message(e.validator, e.validator_value, e.message)}" for e in errors]


def _message(keyword: object, value: object, message: str) -> str:
    if keyword == "pattern" and isinstance(value, str) and value in _PATTERN_MESSAGES:
        return _PATTERN_MESSAGES[value]
    return message if len(message) <= _MESSAGE_CHARS else message[:_MESSAGE_CHARS] + "…"


def encode_event(event: Mapping[str, Any]) -> bytes:
    """The wire form of an event: compact UTF-8 JSON (what producers send and sizes count)."""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_json(raw: bytes | str) -> Any:
    """The JSON value in ``raw``; PermanentError 'undecodable' or 'invalid_json' otherwise."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PermanentError("undecodable", f"not UTF-8: {exc}") from exc
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except RecursionError as exc:
        detail = f"nested too deeply (the limit is {MAX_DEPTH} levels)"
        raise PermanentError("invalid_json", detail) from exc
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity
        raise PermanentError("invalid_json", str(exc)[:_MESSAGE_CHARS]) from exc


def structure_errors(obj: object) -> list[str]:
    """Violations of the rules JSON Schema cannot express: depth, lone surrogates, non-finite
    numbers and non-JSON types. Iterative, so any depth is safe to check."""
    problems: list[str] = []
    stack: list[tuple[object, str, int]] = [(obj, "$", 1)]
    while stack and len(problems) < 10:
        value, path, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                problems.append(f"{path}: nested deeper than {MAX_DEPTH} levels")
                continue
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and _has_surrogate(key):
                    problems.append(f"{path}: a key holds a lone surrogate (not UTF-8)")
                stack.append((item, _child(path, key), depth + 1))
        elif isinstance(value, str):
            if _has_surrogate(value):
                problems.append(f"{path}: holds a lone surrogate (not encodable as UTF-8)")
        elif isinstance(value, float):
            if not math.isfinite(value):
                problems.append(f"{path}: {value} is not a finite number")
        elif not (value is None or isinstance(value, bool | int)):
            problems.append(f"{path}: {type(value).__name__} is not a JSON value")
    return problems


def _child(path: str, key: object) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def event_problems(obj: object, max_bytes: int | None) -> list[str]:
    """Why ``obj`` (a decoded JSON value) is not a document event of at most ``max_bytes`` in
    its wire form (``encode_event``); empty when it is one. ``max_bytes=None``: the caller
    checked the size of the record it decoded."""
    checked = _check(obj, max_bytes)
    return checked if isinstance(checked, list) else []


def _check(obj: object, max_bytes: int | None) -> DocumentEvent | list[str]:
    problems = structure_errors(obj)
    if problems:
        return problems
    if max_bytes is not None and isinstance(obj, dict):
        size = len(encode_event(obj))
        if size > max_bytes:
            return [f"oversize: {size} bytes, the limit is {max_bytes}"]
    problems = _contract_errors(obj)
    if problems:
        return problems
    try:
        event = DocumentEvent.model_validate(obj)
        event.occurred_at.astimezone(UTC)
    except ValidationError as exc:
        return [f"$.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    except OverflowError:
        return ["$.occurred_at: out of range once converted to UTC"]
    return event


def _contract_errors(obj: object) -> list[str]:
    """Violations of the schema the event's ``schema_version`` names, then of the facts' rules
    JSON Schema cannot state."""
    version = obj.get("schema_version", 1) if isinstance(obj, dict) else 1
    if not isinstance(version, int) or isinstance(version, bool) or version not in SCHEMAS:
        return [f"$.schema_version: {version!r} is not a known version {sorted(SCHEMAS)}"]
    problems = schema_errors(obj, SCHEMAS[version])
    if version == 1 and isinstance(obj, dict) and any(f in obj for f in FIELDS):
        problems.append(f"$: {', '.join(FIELDS)} need schema_version 2")
    if problems or version == 1 or not isinstance(obj, dict):
        return problems
    return fact_problems(obj)


def parse_document_event(raw: bytes | str, max_bytes: int) -> DocumentEvent:
    """Decode, size-check and validate one record; raise PermanentError with the reason.

    Any input ends in a valid event or a PermanentError: nothing else is raised."""
    size = len(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise PermanentError("oversize", f"record is {size} bytes; the limit is {max_bytes}")
    checked = _check(decode_json(raw), None)
    if isinstance(checked, list):
        raise PermanentError("contract_violation", "; ".join(checked))
    return checked
