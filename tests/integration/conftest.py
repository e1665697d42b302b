"""Fixtures of the integration modules only (the suite's own are in tests/conftest.py)."""

from tests.support.graph_walks import walks
from tests.support.property_corpus import env

__all__ = ["env", "walks"]
