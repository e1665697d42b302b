"""Retrieval monitoring (issue 21, deliverable 5; the seed's section 7.1.3): which path pattern
each query took, which arm of the auto router's A/B split it was in, query ids that carry both
to feedback, and how much of the last hour's traffic the most common pattern took (path
diversity). Pure: services/query_api/metrics.py records, the service decides.

A path pattern names the mode, the hops and, where the mode follows typed edges, the relation
types in order (docs/curation.md, "Retrieval monitoring"):

- ``vector``: no graph walk;
- ``global:L<level>``: the best community's level;
- ``local:<n>hop``: the passages of the best chain (a chain steps from passage to passage
  through an entity both mention, so its edges have no relation type; 1 when no chain grew);
- ``path:<n>hop:<type>><type>...``: the best route's relation types (at most MAX_TYPES, then
  ``>...``); ``path:none`` and ``global:none`` when the mode found nothing.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter, OrderedDict, deque
from typing import get_args

from services.retrieval.contexts import Retrieval
from services.retrieval.schemas import Arm, Mode

ARMS: tuple[str, ...] = get_args(Arm)
MODES: tuple[str, ...] = get_args(Mode)
MAX_TYPES = 4  # relation types a path pattern spells out
PATTERN_LABELS = 64  # distinct patterns one process reports as metric labels; then "other"
WINDOW_S = 3600.0  # the seed's alert: one pattern above 80% of an hour's queries
_TYPE = re.compile(r"[^a-z0-9_]+")


def path_pattern(result: Retrieval) -> str:
    """The pattern of one retrieval (the module docstring lists them)."""
    if result.mode == "vector":
        return "vector"
    if result.mode == "global":
        levels = [c.level for c in result.communities]
        return f"global:L{levels[0]}" if levels else "global:none"
    if result.mode == "path":
        if not result.routes:
            return "path:none"
        types = [relation_label(hop[1]) for hop in result.routes[0].hops]
        shown = ">".join(types[:MAX_TYPES]) + (">..." if len(types) > MAX_TYPES else "")
        return f"path:{len(types)}hop:{shown}"
    return f"local:{max(len(result.chain), 1)}hop"


def relation_label(relation: str) -> str:
    """A relation type as a pattern spells it: lower case, [a-z0-9_], at most 24 characters
    (an LLM extractor names types freely)."""
    return _TYPE.sub("_", relation.lower()).strip("_")[:24] or "related"


def ab_swap(mode: Mode) -> Mode:
    """The other arm's mode: a graph mode's question goes to vector, a vector one to local (the
    seed's A/B test of graph against vector routing)."""
    return "local" if mode == "vector" else "vector"


def query_id(mode: str, arm: Arm) -> str:
    """A new query id that carries its mode used and arm, so feedback sent to any process of
    the API is counted under them without shared state: ``<arm>.<mode>.<32 hex digits>``."""
    return f"{arm}.{mode}.{uuid.uuid4().hex}"


def parse_query_id(value: str) -> tuple[str, str]:
    """(arm, mode) of a query id; ValueError names what is wrong."""
    parts = value.split(".")
    if len(parts) != 3 or not re.fullmatch(r"[0-9a-f]{32}", parts[2]):
        raise ValueError("a query id is <arm>.<mode>.<32 hex digits>, as /v1/query returned it")
    arm, mode = parts[0], parts[1]
    if arm not in ARMS or mode not in MODES:
        raise ValueError(f"unknown arm or mode in the query id: {arm!r}, {mode!r}")
    return arm, mode


class PatternLabels:
    """Bounded metric labels: the first PATTERN_LABELS distinct patterns keep their name, later
    ones count as "other" (a label set that grows with the data would grow Prometheus)."""

    def __init__(self, limit: int = PATTERN_LABELS) -> None:
        self.limit = limit
        self._known: set[str] = set()

    def label(self, pattern: str) -> str:
        if pattern in self._known:
            return pattern
        if len(self._known) >= self.limit:
            return "other"
        self._known.add(pattern)
        return pattern


class PathWindow:
    """The patterns of the last ``span_s`` seconds and the share the most common one took."""

    def __init__(self, span_s: float = WINDOW_S) -> None:
        self.span_s = span_s
        self._seen: deque[tuple[float, str]] = deque()
        self._counts: Counter[str] = Counter()

    def add(self, pattern: str, now: float | None = None) -> None:
        at = time.monotonic() if now is None else now
        self._seen.append((at, pattern))
        self._counts[pattern] += 1
        self._expire(at)

    def top_share(self, now: float | None = None) -> float:
        """The most common pattern's share of the window's queries (0 when there were none)."""
        self._expire(time.monotonic() if now is None else now)
        total = len(self._seen)
        return max(self._counts.values()) / total if total else 0.0

    def _expire(self, now: float) -> None:
        while self._seen and self._seen[0][0] <= now - self.span_s:
            _, pattern = self._seen.popleft()
            self._counts[pattern] -= 1
            if not self._counts[pattern]:
                del self._counts[pattern]


class FeedbackLedger:
    """Query ids whose feedback was counted by this process (the newest ``limit``): a second
    verdict on the same query is not counted twice here. Another process of the API does not
    know this one's ledger (docs/curation.md says so)."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._ids: OrderedDict[str, None] = OrderedDict()

    def first(self, query_id: str) -> bool:
        """True the first time this id is given (and records it)."""
        if query_id in self._ids:
            return False
        self._ids[query_id] = None
        if len(self._ids) > self.limit:
            self._ids.popitem(last=False)
        return True
