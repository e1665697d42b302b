"""A query's filters (services/retrieval/filters.py): validation with clear errors, compilation
to a DocScope (a day covers its whole day; ranges of numbers and of times; any-of lists; dotted
paths), the Python rule DocScope.admits, and the CLI's options."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from pydantic import ValidationError

from services.cli.query import filters_from_options
from services.core.doc_scope import DocScope, parse_time
from services.retrieval.filters import Filters

T = datetime(2023, 11, 24, 12, tzinfo=UTC)


def _scope(filters: dict[str, object]) -> DocScope:
    scope = Filters.model_validate(filters).scope()
    assert scope is not None
    return scope


def test_empty_filters_are_no_scope() -> None:
    assert Filters().scope() is None
    assert Filters.model_validate({"metadata": {}}).scope() is None


def test_values_lists_and_ranges_compile_to_conditions() -> None:
    scope = _scope(
        {
            "metadata": {
                "source": "The Verge",
                "category": ["tech", "business"],
                "pages": {"gte": 10, "lt": 100},
                "cloudevent.source": "/dms",
            }
        }
    )
    assert scope.conds == [
        {"any": ["tech", "business"], "path": ["category"]},
        {"any": ["/dms"], "path": ["cloudevent", "source"]},
        {"num": {"gte": 10, "lt": 100}, "path": ["pages"]},
        {"any": ["The Verge"], "path": ["source"]},
    ]
    assert scope.admits(
        {"source": "The Verge", "category": "tech", "pages": 10, "cloudevent": {"source": "/dms"}},
        T,
    )
    assert not scope.admits({"source": "The Verge", "category": "tech", "pages": 100}, T)
    assert not scope.admits({"source": "Wired", "category": ["business"], "pages": 50}, T)


def test_a_date_covers_its_day_and_gt_lt_exclude_it() -> None:
    day = _scope({"occurred_at": {"gte": "2023-11-24", "lte": "2023-11-24"}})
    assert day.occurred_from == datetime(2023, 11, 24, tzinfo=UTC)
    assert day.occurred_until == datetime(2023, 11, 25, tzinfo=UTC)
    assert day.admits(None, datetime(2023, 11, 24, 23, 59, tzinfo=UTC))
    assert not day.admits(None, datetime(2023, 11, 25, tzinfo=UTC))
    after = _scope({"occurred_at": {"gt": "2023-11-24"}})
    assert after.occurred_from == datetime(2023, 11, 25, tzinfo=UTC)
    before = _scope({"occurred_at": {"lt": "2023-11-24T06:00:00+02:00"}})
    assert before.occurred_until == datetime(2023, 11, 24, 4, tzinfo=UTC)


def test_time_ranges_on_metadata_read_iso_times_only() -> None:
    scope = _scope({"metadata": {"published": {"gte": "2023-11-24"}}})
    assert scope.admits({"published": "2023-11-24T00:00:00+00:00"}, T)
    assert scope.admits({"published": "2023-11-24"}, T)
    assert not scope.admits({"published": "2023-11-23T23:59:59Z"}, T)
    assert not scope.admits({"published": "Nov 24 2023"}, T)  # not ISO: never in a range
    assert not scope.admits({"published": "2023-11-31"}, T)  # no such day
    assert not scope.admits({"published": 20231124}, T)
    assert not scope.admits({}, T)
    assert parse_time("2023-11-24 10:00") == datetime(2023, 11, 24, 10, tzinfo=UTC)


def test_values_match_numbers_by_value_and_arrays_by_element() -> None:
    scope = _scope({"metadata": {"n": 1, "tags": "red", "flag": True}})
    assert scope.admits({"n": 1.0, "tags": ["blue", "red"], "flag": True}, T)
    assert not scope.admits({"n": True, "tags": ["red"], "flag": True}, T)  # true is not 1
    assert not scope.admits({"n": 1, "tags": "red", "flag": 1}, T)


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"metadata": {"rank": {}}}, "at least one of gte"),
        ({"metadata": {"rank": {"gte": 1, "lt": "2023-01-01"}}}, "all numbers or all times"),
        ({"metadata": {"published": {"gte": "Nov 24 2023"}}}, "not an ISO 8601"),
        ({"metadata": {"a..b": 1}}, "String should match pattern"),
        ({"metadata": {"a": []}}, "at least 1 item"),
        ({"metadata": {f"f{i}": 1 for i in range(17)}}, "at most 16"),
        ({"occurred_at": {"gte": 3}}, "not numbers"),
        ({"held": {"lt": 1990}}, "not numbers"),
        ({"colour": "red"}, "Extra inputs are not permitted"),
    ],
)
def test_bad_filters_say_what_is_wrong(bad: dict[str, object], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        Filters.model_validate(bad)


def test_cli_options_make_filters() -> None:
    assert filters_from_options([], None, None, None) is None
    got = filters_from_options(
        ["source=The Verge", "source=Wired", "year=2023", "team=a=b"],
        "2023-11-01",
        "2023-11-30",
        '{"metadata": {"lang": "en"}}',
    )
    assert got == {
        "metadata": {"lang": "en", "source": ["The Verge", "Wired"], "year": 2023, "team": "a=b"},
        "occurred_at": {"gte": "2023-11-01", "lte": "2023-11-30"},
    }
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        filters_from_options(["source"], None, None, None)
    with pytest.raises(ValueError, match="JSON object"):
        filters_from_options([], None, None, "[1]")


def test_a_fact_time_window_is_days_and_admits_documents_whose_facts_meet_it() -> None:
    scope = _scope({"held": {"gte": "1811-01-01", "lte": "1827-12-31"}})
    assert (scope.held, scope.held_from, scope.held_until) == (
        True,
        date(1811, 1, 1),
        date(1828, 1, 1),
    )
    assert "states a fact held in [1811-01-01, 1828-01-01)" in scope.describe()
    # A date-time counts as its day; an open side stays open.
    later = _scope({"held": {"gt": "1990-05-01T12:00:00Z"}})
    assert (later.held_from, later.held_until) == (date(1990, 5, 1), None)
    owned = [(date(1811, 1, 1), date(1828, 1, 1))]
    assert scope.admits({}, T, owned)
    assert scope.admits({}, T, [(None, date(1811, 1, 2))])  # an open start meets it
    assert not scope.admits({}, T, [(date(1828, 1, 1), None)])  # begins the day after
    assert not scope.admits({}, T, [])  # a document that states no time
    assert not _scope({"held": {"lt": "1811-01-01"}}).admits({}, T, owned)
