"""bench/entity_pairs.py's interval: the 95% Wilson score interval of a proportion."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from entity_pairs import wilson  # noqa: E402


def test_wilson_interval_matches_known_values() -> None:
    low, high = wilson(2, 40)  # 5%: 1.4% to 16.5% (Wilson, z = 1.96)
    assert low == pytest.approx(0.0138, abs=1e-3)
    assert high == pytest.approx(0.1650, abs=1e-3)
    assert wilson(0, 0) == (0.0, 1.0)
    zero_low, zero_high = wilson(0, 50)
    assert zero_low == 0.0
    assert 0.06 < zero_high < 0.08  # no hit in 50 still allows up to ~7%
