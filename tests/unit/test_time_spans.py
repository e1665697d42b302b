"""Time expressions as spans of days (services/core/time_spans.py): points of each
granularity, ranges, open sides, a start taken from the same sentence, and what is not a time."""

from __future__ import annotations

import pytest

from services.core.time_spans import TimeSpan, parse_span, stated_spans

Side = str | None


def spans(sentence: str) -> list[tuple[Side, Side, str]]:
    return [(*s.iso(), s.expression) for s in stated_spans(sentence)]


@pytest.mark.parametrize(
    ("sentence", "want"),
    [
        ("Born on 2 March 1911 in Paris.", [("1911-03-02", "1911-03-03", "2 March 1911")]),
        ("Born March 2, 1911.", [("1911-03-02", "1911-03-03", "March 2, 1911")]),
        ("Published 2023-11-24.", [("2023-11-24", "2023-11-25", "2023-11-24")]),
        ("Opened in Dec 1999.", [("1999-12-01", "2000-01-01", "Dec 1999")]),
        ("Opened in 1999-12.", [("1999-12-01", "2000-01-01", "1999-12")]),
        ("Built in 1974.", [("1974-01-01", "1975-01-01", "1974")]),
        ("Popular in the 1990s.", [("1990-01-01", "2000-01-01", "1990s")]),
        ("He owned it from 1811 to 1827.", [("1811-01-01", "1828-01-01", "from 1811 to 1827")]),
        (
            "Played between April 1935 and April 1937.",
            [("1935-04-01", "1937-05-01", "between April 1935 and April 1937")],
        ),
        ("Mayor 1990–1995.", [("1990-01-01", "1996-01-01", "1990–1995")]),
        ("Here since June 2003.", [("2003-06-01", None, "since June 2003")]),
        ("Left after 2010.", [("2011-01-01", None, "after 2010")]),
        ("He served until 1990.", [(None, "1991-01-01", "until 1990")]),
        ("Closed before March 1, 1921.", [(None, "1921-03-01", "before March 1, 1921")]),
        (
            "Bought it in 1827 and owned it until 1850.",
            [
                ("1827-01-01", "1828-01-01", "1827"),
                ("1827-01-01", "1851-01-01", "1827 and owned it until 1850"),
            ],
        ),
        ("No time here, 42 or 999 or 2150.", []),
        ("On February 30, 1990 nothing.", []),  # not a day: no time rather than a wrong one
    ],
)
def test_stated_spans(sentence: str, want: list[tuple[Side, Side, str]]) -> None:
    assert spans(sentence) == want


def test_a_reversed_range_is_two_points() -> None:
    assert [s.iso() for s in stated_spans("from 1990 to 1980")] == [
        ("1990-01-01", None),
        ("1980-01-01", "1981-01-01"),
    ]


def test_parse_span_from_two_sides() -> None:
    span = parse_span("1811", "March 1827")
    assert span is not None
    assert span.iso() == ("1811-01-01", "1827-04-01")
    assert parse_span("", "") is None
    assert parse_span("not a date", "") is None
    assert parse_span("1990", "1980") is None
    open_end = parse_span("2001-05", "")
    assert open_end is not None
    assert open_end.iso() == ("2001-05-01", None)


def test_an_empty_span_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        TimeSpan(stated_spans("in 1990")[0].end, stated_spans("in 1990")[0].start, "x")
