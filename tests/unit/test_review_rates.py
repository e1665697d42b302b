"""services/maintenance/review.py's pure parts: the Wilson interval, rates and item checks."""

from __future__ import annotations

import pytest

from services.maintenance.review import check_item, rate, wilson


def test_wilson_interval_matches_known_values() -> None:
    low, high = wilson(2, 40)  # 5%: 1.4% to 16.5% (Wilson, z = 1.96)
    assert low == pytest.approx(0.0138, abs=1e-3)
    assert high == pytest.approx(0.1650, abs=1e-3)
    assert wilson(0, 0) == (0.0, 1.0)
    zero_low, zero_high = wilson(0, 50)
    assert zero_low == 0.0
    assert 0.06 < zero_high < 0.08  # no hit in 50 still allows up to ~7%


def test_rate_reports_share_and_interval() -> None:
    assert rate(12, 57) == {"hits": 12, "of": 57, "share": 0.211, "ci95": [0.125, 0.333]}
    assert rate(0, 0)["share"] is None


def _item(**changes: object) -> dict[str, object]:
    side = {"contexts": [{"doc_id": "d1", "surface": "Mao"}]}
    return {"kind": "candidate", "a": side, "b": side, "label": "same", **changes}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kind": "pair"}, "kind must be one of"),
        ({"label": "maybe"}, "label must be one of"),
        ({"label": None}, "label must be one of"),
        ({"a": {"contexts": []}}, "a.contexts"),
        ({"b": {"contexts": [{"doc_id": "d2"}]}}, "b.contexts"),
        ({"a": "Mao"}, "a.contexts"),
        ({"a": {"contexts": ["doc_id surface"]}}, "a.contexts"),
    ],
)
def test_bad_items_are_named(changes: dict[str, object], message: str) -> None:
    check_item(_item())
    with pytest.raises(ValueError, match=message):
        check_item(_item(**changes))
