"""When a question asks about, and when a sentence says something held (pure; issue 31, step
5). Years are the unit: "from Apr 1935 to Apr 1937" is 1935-1937, "in 1974" is 1974.

- **The question's scope**: "from / between Y1 to / and / until Y2" is [Y1, Y2]; "in Y" is
  [Y, Y]; "before Y" and "until Y" are [-inf, Y]; "after Y" and "since Y" are [Y, +inf]. The
  scope's own year counts on both sides (a value that changed during Y held in Y): with years
  as the unit, a boundary year cannot be split.
- **A sentence's time**: a range it states ("from 1811 to 1827", "1811-1827", "between 1811
  and 1827") is [Y1, Y2]; "since / from / after Y" is [Y, +inf] (it goes on); "until / till /
  before / up to Y" is [Y0, Y] where Y0 is the earliest other year of the sentence, else [Y, Y]
  (it says when something ended, not that it held for ever before); any other year is [Y, Y].
  A sentence with several has each.
- **Overlap**: a sentence holds in the scope when one of its times meets the scope.
- **Fit**: among sentences that hold, how closely: the years a time shares with the scope over
  the years either covers (an open side takes the other's bound), the best of its times.

The offline answer reads the question's span from sentences that hold in the scope first
(services/retrieval/answer_span.py). A sentence without a year says nothing either way.
Abstaining when the matching sentences of the top passages state times and none holds in the
scope was tried and not kept: on timeqa-train it abstained on 23 of the 189 unanswerable
questions and wrongly on 52 answerable ones (precision .31; docs/retrieval.md).

Stored facts read their sentences' times with services/core/time_spans.py (days, open sides
left open); this module keeps its own rules in years for ranking answers ("until Y" starts at
the sentence's earliest year), measured on the dev sets as they are, and shares its patterns."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from services.core.time_spans import MONTH_PATTERN, YEAR_PATTERN

_MONTH = MONTH_PATTERN
_YEAR = rf"({YEAR_PATTERN})"  # captured: the rules below read the year
# a year with what may come before it in a date: "2 March 1911", "Apr 1935", "March 2, 1911"
_DATED = rf"(?:(?:\d{{1,2}}\s+)?{_MONTH}\s+(?:\d{{1,2}},?\s+)?)?{_YEAR}\b"
_SPAN = re.compile(
    rf"\b(?:from|between)\s+{_DATED}\s*(?:to|and|until|till|through|-|–|—)\s*{_DATED}",
    re.IGNORECASE,
)
_DASHED = re.compile(rf"\b{_YEAR}\s*(?:-|–|—)\s*{_YEAR}\b")
_OPEN_AFTER = re.compile(rf"\b(?:after|since|from|starting(?: in)?)\s+(?:the\s+)?{_DATED}", re.I)
_OPEN_BEFORE = re.compile(rf"\b(?:before|until|till|up to|prior to)\s+{_DATED}", re.IGNORECASE)
_IN = re.compile(rf"\b(?:in|during|of|on)\s+{_DATED}", re.IGNORECASE)
_ANY = re.compile(rf"\b{_YEAR}\b")

Interval = tuple[float, float]


@dataclass(frozen=True)
class Scope:
    """The years a question asks about, inclusive (infinite for an open side)."""

    start: float
    end: float

    def meets(self, times: Iterable[Interval]) -> bool:
        """Whether one of the times overlaps the scope."""
        return any(a <= self.end and self.start <= b for a, b in times)

    def fit(self, times: Iterable[Interval]) -> float:
        """How closely the best of the times matches the scope: the years they share over the
        years either covers (1: the same years; 0: none shared). An open side of either takes
        the other's bound there (it says nothing beyond it)."""
        best = 0.0
        for a, b in times:
            lo = (a if math.isinf(self.start) else self.start, self.start if math.isinf(a) else a)
            hi = (b if math.isinf(self.end) else self.end, self.end if math.isinf(b) else b)
            if any(math.isinf(v) for v in (*lo, *hi)):
                shared = 1.0 if a <= self.end and self.start <= b else 0.0
                best = max(best, shared)
                continue
            shared = min(hi) - max(lo) + 1
            if shared > 0:
                best = max(best, shared / (max(hi) - min(lo) + 1))
        return best


def question_scope(question: str) -> Scope | None:
    """The question's time scope, or None when it names none."""
    if m := _SPAN.search(question):
        a, b = int(m.group(1)), int(m.group(2))
        return Scope(min(a, b), max(a, b))
    if m := _OPEN_BEFORE.search(question):
        return Scope(-math.inf, int(m.group(1)))
    if m := _OPEN_AFTER.search(question):
        return Scope(int(m.group(1)), math.inf)
    if m := _IN.search(question):
        return Scope(int(m.group(1)), int(m.group(1)))
    return None


def sentence_times(sentence: str) -> list[Interval]:
    """The times a sentence states (none when it has no year)."""
    return [time for time, _ in stated_times(sentence)]


def stated_times(sentence: str) -> list[tuple[Interval, tuple[int, int]]]:
    """The times a sentence states, each with where it is stated (its characters)."""
    times: list[tuple[Interval, tuple[int, int]]] = []
    taken: list[tuple[int, int]] = []

    def free(m: re.Match[str]) -> bool:
        return not any(s <= m.start() < e for s, e in taken)

    for pattern, shape in (
        (_SPAN, "range"),
        (_DASHED, "range"),
        (_OPEN_AFTER, "after"),
        (_OPEN_BEFORE, "before"),
    ):
        for m in pattern.finditer(sentence):
            if not free(m):
                continue
            taken.append(m.span())
            if shape == "range":
                a, b = int(m.group(1)), int(m.group(2))
                times.append(((min(a, b), max(a, b)), m.span()))
            elif shape == "after":
                times.append(((int(m.group(1)), math.inf), m.span()))
            else:
                times.append(((-math.inf, int(m.group(1))), m.span()))
    for m in _ANY.finditer(sentence):
        if free(m):
            times.append(((int(m.group(1)), int(m.group(1))), m.span()))
    earliest = min((float(y) for y in _ANY.findall(sentence)), default=math.inf)
    return [((earliest if a == -math.inf else a, b), at) for (a, b), at in times]
