"""Questions that name where their documents come from: "the report from The Verge", "according
to 'TechCrunch'". A named value of a document's metadata (a publisher, a department, a
collection) becomes the query's filter, offline and by rule, when the caller did not write one
(issue 31; docs/retrieval.md, "Grounding the question's sources").

**Facets.** A metadata field is a facet when its values are names shared by documents: string
values, at most 100 characters, and fewer distinct values than half the documents that have
the field (a source or a department repeats; a URL, a title or a timestamp does not). Only
values with a capital letter are names (``technology`` is a word a question uses for its own
sake; ``TechCrunch`` is not).

**A value's forms.** The value itself, and the name before a tagline or section separator
(``Cnbc | World Business News Leader`` → ``Cnbc``, ``FOX News - Health`` → ``FOX News``), each
also without a leading "The" (``The New York Times`` → ``New York Times``); at least 3
characters. A form names every value it is a form of (``FOX News`` names each FOX News section).

**Matching.** A form is found in the question case-sensitively on word boundaries; a found form
inside a longer found form does not count (``Times`` in ``New York Times``). The question is
grounded to the one facet with the most named values (ties: the facet with fewer distinct
values, the more facet-like), as "any of" those values: naming a source and an author does not
require both of one document, since a name can be quoted rather than authored.

The vocabulary is read from the database at most every ``ttl_s``; what is grounded only ever
narrows the caller's own reads (visibility is unchanged), and the service reads again without
it when nothing in the grounded documents answers (services/query_api/service.py)."""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.query_api.filters import MAX_VALUES, Filters

MAX_VALUE_CHARS = 100
MIN_FORM_CHARS = 3
MAX_VALUES_PER_FIELD = 5000  # the most frequent; bounds the vocabulary's memory
_SEPARATORS = re.compile(r"\s+(?:\||-|–|—|:)\s+")
_CAPITAL = re.compile(r"[A-Z]")

_VOCABULARY = text(
    "WITH v AS (SELECT e.key, e.value #>> '{}' AS value, count(*) AS n FROM documents d,"
    " jsonb_each(d.metadata) e WHERE NOT d.deleted AND jsonb_typeof(e.value) = 'string'"
    " GROUP BY 1, 2),"
    " f AS (SELECT key, count(*) AS distinct_values, sum(n) AS docs FROM v GROUP BY key)"
    " SELECT v.key, v.value, v.n, f.distinct_values FROM v JOIN f USING (key)"
    " WHERE f.distinct_values * 2 < f.docs AND length(v.value) <= :max_chars"
    " AND v.value ~ '[A-Z]'"
    " ORDER BY v.key, v.n DESC, v.value"
)


def forms(value: str) -> set[str]:
    """The ways a question may name ``value``."""
    heads = {value.strip(), _SEPARATORS.split(value.strip(), maxsplit=1)[0]}
    out = set()
    for head in heads:
        out.add(head)
        if head.startswith("The "):
            out.add(head[4:])
    return {f for f in out if len(f) >= MIN_FORM_CHARS and _CAPITAL.search(f)}


@dataclass(frozen=True)
class Vocabulary:
    """Per facet field, the values each form names, and the field's number of distinct
    values."""

    named: Mapping[str, Mapping[str, frozenset[str]]]  # field -> form -> values
    sizes: Mapping[str, int]

    @classmethod
    def of(cls, rows: Iterable[tuple[str, str, int]]) -> Vocabulary:
        """From (field, value, distinct values of the field) rows of facet fields."""
        named: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        sizes: dict[str, int] = {}
        kept: dict[str, int] = defaultdict(int)
        for key, value, distinct in rows:
            sizes[key] = distinct
            if kept[key] >= MAX_VALUES_PER_FIELD:
                continue
            kept[key] += 1
            for form in forms(value):
                named[key][form].add(value)
        return cls({k: {f: frozenset(v) for f, v in by.items()} for k, by in named.items()}, sizes)

    def ground(self, question: str) -> Filters | None:
        """The filter the question's named values make (None when it names none)."""
        best: tuple[int, int, str] | None = None
        found: dict[str, set[str]] = {}
        for key, by_form in self.named.items():
            spans = [
                (m.start(), m.end(), form)
                for form in by_form
                for m in re.finditer(rf"(?<!\w){re.escape(form)}(?!\w)", question)
            ]
            inside = {s for s in spans for t in spans if t != s and t[0] <= s[0] and s[1] <= t[1]}
            values = {v for s in spans if s not in inside for v in by_form[s[2]]}
            if not values or len(values) > MAX_VALUES:  # none, or too many to say which
                continue
            found[key] = values
            rank = (len(values), -self.sizes.get(key, 0), key)
            if best is None or rank > best:
                best = rank
        if best is None:
            return None
        key = best[2]
        return Filters.model_validate({"metadata": {key: sorted(found[key])}})


@dataclass
class FacetCache:
    """The vocabulary, read again at most every ``ttl_s``."""

    ttl_s: float = 60.0
    _value: Vocabulary | None = None
    _at: float = field(default=0.0)

    async def get(self, conn: AsyncConnection) -> Vocabulary:
        now = time.monotonic()
        if self._value is None or now - self._at > self.ttl_s:
            rows = await conn.execute(_VOCABULARY, {"max_chars": MAX_VALUE_CHARS})
            self._value = Vocabulary.of((str(r[0]), str(r[1]), int(r[3])) for r in rows.all())
            self._at = now
        return self._value
