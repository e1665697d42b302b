"""When a sentence says something held: its time expressions as normalised spans (pure; issue
31, step 2). A span is a half-open range of days ``[start, end)``; ``None`` is an open side
(the sentence does not say when it began, or says it goes on).

- **A point** is a day ("2 March 1911", "March 2, 1911", "1911-03-02"), a month ("March 1911",
  "1911-03"), a year ("1911") or a decade ("the 1990s"): the days it covers. Years run from
  1000 to 2099, so that counts and page numbers are not read as years.
- **A range**: "from / between P1 to / and / until / through P2" and "P1-P2" (a dash, years
  or months) cover P1's first day to P2's last.
- **An open side**: "since / from / starting P" begin at P (and go on); "after P" begins when
  P ends; "until / till / through / up to P" end when P ends; "before / prior to P" end when P
  begins. The other side is open (a sentence that says when something ended does not say when
  it began), unless the sentence named a time just before it that begins earlier ("bought it
  in 1827 and owned it until 1850" is 1827 to 1850; the point "in 1827" is kept too).
- **Anything else** ("in P", "on P", a bare P) is P itself.

A sentence may state several spans; each is kept with the words that stated it. The rules
follow the words' ordinary meaning in English and are not fitted to a corpus."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date

MONTH_NAMES = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_MONTHS = {m[:3].casefold(): i for i, m in enumerate(MONTH_NAMES, start=1)}
# A month's name, whole or short ("Sept."), and a year 1000-2099: regex parts, no groups
# (services/retrieval/time_scope.py reads questions with them too).
MONTH_PATTERN = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)
YEAR_PATTERN = r"(?:1[0-9]{3}|20[0-9]{2})"
_MONTH, _YEAR = MONTH_PATTERN, YEAR_PATTERN
_DAY = r"(?:[12][0-9]|3[01]|0?[1-9])"
_POINT = re.compile(
    rf"""\b(?:
      (?P<iy>{_YEAR})-(?P<im>0[1-9]|1[0-2])(?:-(?P<id>0[1-9]|[12][0-9]|3[01]))?(?![-\d])
    | (?P<d1>{_DAY})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<m1>{_MONTH}),?\s+(?P<y1>{_YEAR})
    | (?P<m2>{_MONTH})\s+(?P<d2>{_DAY})(?:st|nd|rd|th)?,?\s+(?P<y2>{_YEAR})
    | (?P<m3>{_MONTH}),?\s+(?:of\s+)?(?P<y3>{_YEAR})
    | (?P<decade>1[0-9]{{2}}0|20[0-9]0)s
    | (?P<y4>{_YEAR})
    )\b""",
    re.IGNORECASE | re.VERBOSE,
)
_RANGE_OPENER = re.compile(r"\b(?:from|between)\s+(?:the\s+)?$", re.IGNORECASE)
_RANGE_JOIN = re.compile(r"^\s*(?:to|and|until|till|through|thru|-|–|—)\s*(?:the\s+)?$", re.I)
_DASH = re.compile(r"^\s*(?:-|–|—)\s*$")
_OPENERS = (
    (
        re.compile(r"\b(?:since|from|starting(?:\s+in)?|beginning(?:\s+in)?)\s+(?:the\s+)?$", re.I),
        "from",
    ),
    (re.compile(r"\bafter\s+(?:the\s+)?$", re.I), "after"),
    (re.compile(r"\b(?:until|till|through|up\s+to)\s+(?:the\s+)?$", re.I), "until"),
    (re.compile(r"\b(?:before|prior\s+to)\s+(?:the\s+)?$", re.I), "before"),
)


@dataclass(frozen=True)
class TimeSpan:
    """Days ``[start, end)`` something held; None is an open side. ``expression``: the words
    that state it."""

    start: date | None
    end: date | None
    expression: str

    def __post_init__(self) -> None:
        if self.start is not None and self.end is not None and self.start >= self.end:
            raise ValueError(f"an empty span: {self.start} to {self.end}")

    def iso(self) -> tuple[str | None, str | None]:
        """The sides as ISO dates."""
        return (
            None if self.start is None else self.start.isoformat(),
            None if self.end is None else self.end.isoformat(),
        )


@dataclass(frozen=True)
class _Point:
    start: date
    end: date
    at: int  # where its words begin in the sentence
    to: int  # and end


def _after(d: date, *, years: int = 0, months: int = 0, days: int = 0) -> date:
    if days:
        return date.fromordinal(d.toordinal() + days)
    total = d.year * 12 + d.month - 1 + months + 12 * years
    return date(total // 12, total % 12 + 1, 1)


def _point(m: re.Match[str]) -> _Point | None:
    g = m.groupdict()
    try:
        if g["iy"]:
            first = date(int(g["iy"]), int(g["im"]), int(g["id"] or 1))
            end = _after(first, days=1) if g["id"] else _after(first, months=1)
        elif g["y1"] or g["y2"]:
            month = _MONTHS[(g["m1"] or g["m2"])[:3].casefold()]
            first = date(int(g["y1"] or g["y2"]), month, int(g["d1"] or g["d2"]))
            end = _after(first, days=1)
        elif g["y3"]:
            first = date(int(g["y3"]), _MONTHS[g["m3"][:3].casefold()], 1)
            end = _after(first, months=1)
        elif g["decade"]:
            first = date(int(g["decade"]), 1, 1)
            end = _after(first, years=10)
        else:
            first = date(int(g["y4"]), 1, 1)
            end = _after(first, years=1)
    except ValueError:  # 31 February
        return None
    return _Point(first, end, m.start(), m.end())


def stated_spans(sentence: str) -> list[TimeSpan]:
    """The spans a sentence states, in order (none when it names no time)."""
    found = [p for m in _POINT.finditer(sentence) if (p := _point(m)) is not None]
    spans: list[TimeSpan] = []
    i = 0
    consumed = 0  # where the words of the last span ended
    while i < len(found):
        p = found[i]
        before = sentence[consumed : p.at]
        nxt = found[i + 1] if i + 1 < len(found) else None
        if nxt is not None and nxt.end > p.start:
            between = sentence[p.to : nxt.at]
            opener = _RANGE_OPENER.search(before)
            if (opener and _RANGE_JOIN.match(between)) or _DASH.match(between):
                at = opener.start() + consumed if opener else p.at
                spans.append(TimeSpan(p.start, nxt.end, sentence[at : nxt.to]))
                consumed, i = nxt.to, i + 2
                continue
        span = _opened(sentence, before, consumed, p)
        if span.start is None and spans and spans[-1].start is not None:
            # "bought it in 1827 and owned it until 1850": the sentence said when it began.
            began = spans[-1]
            if span.end is not None and began.start is not None and began.start < span.end:
                at = sentence.find(began.expression, 0, p.at)
                words = sentence[at : p.to] if at >= 0 else span.expression
                span = TimeSpan(began.start, span.end, words)
        spans.append(span)
        consumed, i = p.to, i + 1
    return spans


def _opened(sentence: str, before: str, offset: int, p: _Point) -> TimeSpan:
    for pattern, kind in _OPENERS:
        if m := pattern.search(before):
            words = sentence[offset + m.start() : p.to]
            if kind == "from":
                return TimeSpan(p.start, None, words)
            if kind == "after":
                return TimeSpan(p.end, None, words)
            if kind == "until":
                return TimeSpan(None, p.end, words)
            return TimeSpan(None, p.start, words)
    return TimeSpan(p.start, p.end, sentence[p.at : p.to])


def parse_span(start: str, end: str) -> TimeSpan | None:
    """A span from two stated sides (an LLM's ``valid_from`` / ``valid_to``: each a date in
    words or ISO form, or empty for an open side): from the first day of ``start`` to the last
    of ``end``. None when neither side names a time, or the sides are reversed."""
    first = _first_point(start)
    last = _first_point(end)
    if first is None and last is None:
        return None
    lo = None if first is None else first.start
    hi = None if last is None else last.end
    if lo is not None and hi is not None and lo >= hi:
        return None
    words = " to ".join(s.strip() for s in (start, end) if s.strip())
    return TimeSpan(lo, hi, words)


def _first_point(text: str) -> _Point | None:
    for m in _POINT.finditer(text):
        if (p := _point(m)) is not None:
            return p
    return None
