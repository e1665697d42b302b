"""Wire contracts: the JSON Schemas in ``schemas/`` are the source of truth; this module loads
them, validates raw records against them and turns valid ones into typed events."""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any, Literal

from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, Field

from services.core.errors import PermanentError

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"


@cache
def validator(name: str) -> Draft202012Validator:
    """The validator for ``schemas/<name>.json`` (e.g. ``document_event.v1``)."""
    schema = json.loads((SCHEMA_DIR / f"{name}.json").read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


class DocumentEvent(BaseModel):
    """A document event v1 after validation (internal, typed form of the wire object)."""

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


def schema_errors(obj: object, schema: str = "document_event.v1") -> list[str]:
    """Every violation of ``schema`` in ``obj`` as '<json path>: <message>', sorted by path."""
    errors = sorted(validator(schema).iter_errors(obj), key=lambda e: list(map(str, e.path)))
    return [f"{e.json_path}: {e.message}" for e in errors]


def parse_document_event(raw: bytes | str, max_bytes: int) -> DocumentEvent:
    """Decode, size-check and validate one record; raise PermanentError with the reason."""
    size = len(raw.encode("utf-8") if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise PermanentError("oversize", f"record is {size} bytes; the limit is {max_bytes}")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PermanentError("undecodable", f"not UTF-8: {exc}") from exc
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise PermanentError("invalid_json", str(exc)) from exc
    problems = schema_errors(obj)
    if problems:
        raise PermanentError("contract_violation", "; ".join(problems))
    return DocumentEvent.model_validate(obj)
