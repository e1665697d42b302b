"""A query's ``filters``: which documents it is about, by their metadata and their time.

```json
{"metadata": {"source": "The Verge",                      // equal (or an array containing it)
              "category": ["technology", "business"],     // any of
              "pages": {"gte": 10, "lt": 100},            // a range of numbers
              "published_at": {"gte": "2023-11-01"}},     // a range of times (ISO 8601)
 "occurred_at": {"gte": "2023-11-24", "lte": "2023-11-25"},  // the event's time
 "held": {"gte": "1811-01-01", "lte": "1827-12-31"}}         // a fact stated held then
```

A field is a metadata key, or a dotted path into nested objects (``cloudevent.source``). A
date without a time covers its whole day in UTC: ``lte 2023-11-25`` includes that day, ``gt``
excludes it. Times without an offset are UTC. Every condition must hold; a document without the
field fails it. Filters narrow what the caller may see, never widen it: they are applied with
the visibility rule (docs/access-control.md). Compiled to a :class:`DocScope`
(services/core/doc_scope.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime, time, timedelta
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from services.core.access import Caller
from services.core.doc_scope import DocScope, parse_time

MAX_FIELDS = 16
MAX_VALUES = 100
Number = Annotated[float, Field(allow_inf_nan=False)]  # JSON has no NaN or infinity
Integer = int  # any size: JSON numbers, compared by value (PostgreSQL numeric)
Scalar = Annotated[str, StringConstraints(max_length=500)] | Integer | Number | bool
FieldPath = Annotated[
    str,
    StringConstraints(
        min_length=1, max_length=200, pattern=r"^[^.\x00-\x1f\x7f]+(\.[^.\x00-\x1f\x7f]+)*$"
    ),
]
Bound = Number | Integer | Annotated[str, StringConstraints(max_length=64)]


class Range(BaseModel):
    """Bounds of a range: numbers, or ISO 8601 dates / date-times (not both)."""

    model_config = ConfigDict(extra="forbid")

    gte: Bound | None = None
    gt: Bound | None = None
    lte: Bound | None = None
    lt: Bound | None = None

    @field_validator("gte", "gt", "lte", "lt", mode="before")
    @classmethod
    def _not_boolean(cls, value: object) -> object:
        if isinstance(value, bool):
            raise ValueError("a range's bounds are numbers or times, not booleans")  # noqa: TRY004 - pydantic reports ValueError as a validation error
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Range:
        bounds = self.bounds()
        if not bounds:
            raise ValueError("a range needs at least one of gte, gt, lte, lt")
        numbers = [isinstance(v, (int, float)) for v in bounds.values()]
        if any(numbers) and not all(numbers):
            raise ValueError("a range's bounds are all numbers or all times")
        if not any(numbers):
            bad = [v for v in bounds.values() if _instant(str(v)) is None]
            if bad:
                raise ValueError(f"not an ISO 8601 date or date-time: {bad[0]!r}")
        return self

    def bounds(self) -> dict[str, Bound]:
        return {
            k: v
            for k, v in (("gte", self.gte), ("gt", self.gt), ("lte", self.lte), ("lt", self.lt))
            if v is not None
        }

    @property
    def numeric(self) -> bool:
        return all(isinstance(v, (int, float)) for v in self.bounds().values())

    def window(self) -> tuple[datetime | None, datetime | None]:
        """The times as [from, until): a day-only bound covers its whole day."""
        starts: list[datetime] = []
        ends: list[datetime] = []
        for op, value in self.bounds().items():
            found = _instant(str(value))
            if found is None:  # the validator let only times through
                raise ValueError(f"not an ISO 8601 date or date-time: {value!r}")
            start, end = found
            if op == "gte":
                starts.append(start)
            elif op == "gt":
                starts.append(end)
            elif op == "lte":
                ends.append(end)
            else:
                ends.append(start)
        return (max(starts) if starts else None), (min(ends) if ends else None)


def _utc(t: datetime) -> str:
    """An instant in UTC, as PostgreSQL reads it whatever the offset it was written with
    (Python takes offsets to 23:59, PostgreSQL to 15:59)."""
    return t.astimezone(UTC).isoformat()


def _instant(value: str) -> tuple[datetime, datetime] | None:
    """(first instant, first instant after) of an ISO date (a whole UTC day) or date-time (one
    microsecond); None when it is neither. Years 1 to 9998, so that both instants exist."""
    t = parse_time(value)
    if t is None or not date(1, 1, 2) <= t.date() <= date(9998, 12, 31):
        return None
    if len(value.strip()) == len("2023-11-24"):  # a date: its day
        day = datetime.combine(date.fromisoformat(value.strip()), time(), tzinfo=UTC)
        return day, day + timedelta(days=1)
    return t, t + timedelta(microseconds=1)


Condition = Annotated[list[Scalar], Field(min_length=1, max_length=MAX_VALUES)] | Range | Scalar


class Filters(BaseModel):
    """Which documents a query reads: metadata conditions (all must hold) and a time window on
    the documents' ``occurred_at``."""

    model_config = ConfigDict(extra="forbid")

    metadata: dict[FieldPath, Condition] = Field(
        default_factory=dict,
        description="Per metadata field (a key, or a dotted path): a value (equal, or an array "
        "containing it), a list (any of), or a range {gte, gt, lte, lt} of numbers or ISO 8601 "
        f"dates. At most {MAX_FIELDS} fields.",
    )
    occurred_at: Range | None = Field(
        default=None,
        description="A range of ISO 8601 dates or date-times on the document's occurred_at "
        "(a date covers its whole UTC day).",
    )
    held: Range | None = Field(
        default=None,
        description="A range of ISO 8601 dates: documents that state a fact which held on "
        "some day of it (time-scoped facts; a date-time counts as its day).",
    )

    @field_validator("metadata")
    @classmethod
    def _few(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) > MAX_FIELDS:
            raise ValueError(f"at most {MAX_FIELDS} metadata fields")
        return value

    @field_validator("occurred_at", "held")
    @classmethod
    def _times(cls, value: Range | None) -> Range | None:
        if value is not None and value.numeric:
            raise ValueError("takes dates or date-times, not numbers")
        return value

    def scope(self) -> DocScope | None:
        """The compiled scope; None when the filters say nothing."""
        conds: list[dict[str, Any]] = []
        for field, cond in sorted(self.metadata.items()):
            path = field.split(".")
            if isinstance(cond, Range):
                if cond.numeric:
                    conds.append({"path": path, "num": cond.bounds()})
                else:
                    lo, hi = cond.window()
                    conds.append(
                        {"path": path}
                        | ({"from": _utc(lo)} if lo else {})
                        | ({"until": _utc(hi)} if hi else {})
                    )
            else:
                conds.append({"path": path, "any": cond if isinstance(cond, list) else [cond]})
        lo, hi = self.occurred_at.window() if self.occurred_at else (None, None)
        if not conds and lo is None and hi is None and self.held is None:
            return None
        held_from, held_until = _days(self.held) if self.held else (None, None)
        return DocScope.of(
            conds,
            lo and lo.astimezone(UTC),
            hi and hi.astimezone(UTC),
            held=self.held is not None,
            held_from=held_from,
            held_until=held_until,
        )


def _days(held: Range) -> tuple[date | None, date | None]:
    """A fact-time range as days [from, until): a date-time counts as its (UTC) day."""
    lo, hi = held.window()
    start = lo.astimezone(UTC).date() if lo else None
    end = None
    if hi is not None:
        hi = hi.astimezone(UTC)
        end = hi.date() if hi.time() == time() else hi.date() + timedelta(days=1)
    return start, end


def scoped(caller: Caller, filters: Filters | None) -> Caller:
    """The caller whose reads see only the documents ``filters`` admit (as given without)."""
    scope = filters.scope() if filters is not None else None
    return caller if scope is None else replace(caller, scope=scope)
