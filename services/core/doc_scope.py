"""Which documents a read is about: the compiled form of a query's ``filters``
(services/retrieval/filters.py), carried by the :class:`~services.core.access.Caller` so that
every read that states document visibility states the scope with it
(services/retrieval/visibility.py). A scope only narrows: a read sees the documents that are
both visible to the caller and in scope.

In SQL the scope is one predicate with bound values (``DOC_MATCHES``): ``occurred_at`` in
[``occurred_from``, ``occurred_until``), the metadata conditions, a JSON array evaluated by
``kgstream_doc_matches`` (alembic 0022, which states the conditions' shapes), and the days
[``held_from``, ``held_until``) that a fact the document states must meet (``fact_times``,
alembic 0023). :meth:`admits` is the same rule in Python, the oracle of the tests."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

Condition = Mapping[str, Any]


@dataclass(frozen=True)
class DocScope:
    """Documents whose ``occurred_at`` is in [occurred_from, occurred_until), whose metadata
    meets every condition (``conditions``: the JSON text of the array, canonical) and, when
    ``held`` is set, that state a fact which held on some day of [held_from, held_until) (None:
    an open side)."""

    conditions: str | None = None
    occurred_from: datetime | None = None
    occurred_until: datetime | None = None
    held: bool = False
    held_from: date | None = None
    held_until: date | None = None
    # A jsonpath every admitted document's metadata matches (``@?``), which the GIN index on
    # documents.metadata answers (alembic 0024): a pre-filter, never the rule itself.
    index_path: str | None = None

    @classmethod
    def of(
        cls,
        conditions: Sequence[Condition] = (),
        occurred_from: datetime | None = None,
        occurred_until: datetime | None = None,
        *,
        held: bool = False,
        held_from: date | None = None,
        held_until: date | None = None,
    ) -> DocScope:
        text = json.dumps(list(conditions), sort_keys=True, separators=(",", ":"))
        return cls(
            text if conditions else None,
            occurred_from,
            occurred_until,
            held,
            held_from if held else None,
            held_until if held else None,
            _index_path(conditions),
        )

    @property
    def conds(self) -> list[dict[str, Any]]:
        return [] if self.conditions is None else list(json.loads(self.conditions))

    def params(self) -> dict[str, object]:
        """The bound values of ``DOC_MATCHES``."""
        return {
            "f_meta": self.conditions,
            "f_from": self.occurred_from,
            "f_until": self.occurred_until,
            "f_held": self.held,
            "f_held_from": self.held_from,
            "f_held_until": self.held_until,
            "f_path": self.index_path,
        }

    def describe(self) -> str:
        """For notes and logs: the scope in words."""
        parts = []
        if self.occurred_from or self.occurred_until:
            lo = self.occurred_from.isoformat() if self.occurred_from else "-inf"
            hi = self.occurred_until.isoformat() if self.occurred_until else "+inf"
            parts.append(f"occurred_at in [{lo}, {hi})")
        if self.held:
            lo = self.held_from.isoformat() if self.held_from else "-inf"
            hi = self.held_until.isoformat() if self.held_until else "+inf"
            parts.append(f"states a fact held in [{lo}, {hi})")
        for c in self.conds:
            field = ".".join(c["path"])
            if "any" in c:
                parts.append(f"{field} in {c['any']}")
            if "num" in c:
                parts.append(f"{field} {c['num']}")
            if "from" in c or "until" in c:
                parts.append(f"{field} in [{c.get('from', '-inf')}, {c.get('until', '+inf')})")
        return "; ".join(parts) or "all documents"

    def admits(
        self,
        metadata: Mapping[str, Any] | None,
        occurred_at: datetime,
        held: Sequence[tuple[date | None, date | None]] = (),
    ) -> bool:
        """The rule ``DOC_MATCHES`` states, for one document; ``held``: the spans of days
        [start, end) of the facts it states (None: an open side)."""
        if self.occurred_from is not None and occurred_at < self.occurred_from:
            return False
        if self.occurred_until is not None and occurred_at >= self.occurred_until:
            return False
        if self.held and not any(self._meets(span) for span in held):
            return False
        return all(_holds(_at(metadata or {}, c["path"]), c) for c in self.conds)

    def _meets(self, span: tuple[date | None, date | None]) -> bool:
        start, end = span
        lo, hi = self.held_from, self.held_until
        if lo is not None and hi is not None and lo >= hi:
            return False  # an empty window
        return (start is None or self.held_until is None or start < self.held_until) and (
            end is None or self.held_from is None or self.held_from < end
        )


_INDEX_KEY = re.compile(r"^-?[0-9]+$")


def _index_path(conditions: Sequence[Condition]) -> str | None:
    """The first any-of condition as a jsonpath (``$."source" ? (@ == "A" || @ == "B")``), or
    None. Lax mode reads an array's elements as the rule does ("an array containing it"); a
    path with a key of digits is left out (the rule reads it as an array index there)."""
    for c in conditions:
        if "any" not in c or any(_INDEX_KEY.match(key) for key in c["path"]):
            continue
        keys = "".join("." + json.dumps(key, ensure_ascii=False) for key in c["path"])
        equal = " || ".join(f"@ == {json.dumps(v, ensure_ascii=False)}" for v in c["any"])
        return f"${keys} ? ({equal})"
    return None


_MISSING = object()


def _at(metadata: Mapping[str, Any], path: Sequence[str]) -> Any:
    value: Any = metadata
    for key in path:
        if isinstance(value, Mapping) and key in value:
            value = value[key]
        elif (
            isinstance(value, list)
            and key.lstrip("-").isdigit()
            and -len(value) <= int(key) < len(value)
        ):
            value = value[int(key)]  # jsonb's #> reads array elements by index too
        else:
            return _MISSING
    return value


def _same(x: Any, v: Any) -> bool:
    """jsonb equality: numbers by value (1 = 1.0), booleans are not numbers."""
    if isinstance(x, bool) or isinstance(v, bool):
        return isinstance(x, bool) and isinstance(v, bool) and x == v
    if isinstance(x, (int, float)) and isinstance(v, (int, float)):
        return Decimal(str(x)) == Decimal(str(v))
    return bool(x == v) and type(x) is type(v)


def _holds(x: Any, c: Condition) -> bool:
    if x is _MISSING or x is None:
        return False
    checks = (
        ("any", _any_of),
        ("num", _in_numbers),
        ("from", _in_times),
        ("until", _in_times),
    )
    return all(check(x, c) for key, check in checks if key in c)


def _any_of(x: Any, c: Condition) -> bool:
    return any(
        _same(x, v) or (isinstance(x, list) and any(_same(e, v) for e in x)) for v in c["any"]
    )


def _in_numbers(x: Any, c: Condition) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    n, bounds = Decimal(str(x)), {k: Decimal(str(v)) for k, v in c["num"].items()}
    return (
        n >= bounds.get("gte", n)
        and n > bounds.get("gt", n - 1)
        and n <= bounds.get("lte", n)
        and n < bounds.get("lt", n + 1)
    )


def _in_times(x: Any, c: Condition) -> bool:
    t = parse_time(x) if isinstance(x, str) else None
    if t is None:
        return False
    if "from" in c and t < datetime.fromisoformat(c["from"]):
        return False
    return "until" not in c or t < datetime.fromisoformat(c["until"])


# The dates and date-times a time condition reads (alembic 0022 uses the same pattern).
ISO_TIME = re.compile(
    r"^\d{4}-\d{2}-\d{2}([T ]([01]\d|2[0-3]):[0-5]\d"
    r"(:[0-5]\d(\.\d{1,6})?)?(Z|[+-]\d{2}(:?\d{2})?)?)?$"
)


def parse_time(value: str) -> datetime | None:
    """An ISO 8601 date or date-time as an aware instant (no offset: UTC); None when it is
    not one (another spelling, or no such day)."""
    if not ISO_TIME.match(value) or value != value.strip():
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)
