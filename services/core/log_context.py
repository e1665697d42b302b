"""What a log line is about: the event or snapshot being worked on. Handlers bind these fields
with ``bound(...)`` (contextvars, so concurrent asyncio tasks do not see each other's); the
logging setup (services/core/logs.py) adds them to every record. No logging framework here."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

FIELDS = ("event_id", "doc_id", "snapshot_id")

_VARS: dict[str, contextvars.ContextVar[str | int | None]] = {
    name: contextvars.ContextVar(f"kgstream_{name}", default=None) for name in FIELDS
}


@contextmanager
def bound(**fields: str | int | None) -> Iterator[None]:
    """Bind fields (from FIELDS) for the code inside the block; earlier values return after."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown log context field(s): {sorted(unknown)}")
    tokens = [(_VARS[name], _VARS[name].set(value)) for name, value in fields.items()]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def current() -> dict[str, str | int]:
    """The bound fields that have a value."""
    values = {name: var.get() for name, var in _VARS.items()}
    return {name: value for name, value in values.items() if value is not None}
