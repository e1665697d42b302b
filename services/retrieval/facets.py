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

**Sources the collection does not hold.** A question that attributes its facts to a named
source ("a Bloomberg article", "a report by Reuters", "another by Forbes": capitalised words
before a word for a piece of writing, or after "from / by" one, "reported by", "published
by") that no facet value's form names and no document the caller may read mentions (as an
entity's alias), asked of documents with a facet of names in words (most values with a
lower-case letter: "The Verge", not a code such as "P466"), asks for what the collection does
not hold: the answer says it does not know (services/retrieval/service.py), to a caller who
may read every document (for another, which sources exist among documents it may not read
would show in whether it is told so; the rule is off). Known values' words
are masked first, longest first, so a section of a known source ("Life and Style" of "The
Independent - Life and Style") is not a new name.

**Whose values.** A caller's question is grounded to the values of its own tenant's documents
(the operator's, to every tenant's), so no tenant's documents steer or reveal another's; within
a tenant, the note the response carries names the question's own words that were grounded, not
the values (which may belong to documents the caller cannot see). A form that is a function
word ("What", "Which") never names anything, whatever a document's metadata says.

The vocabulary is read on a process's first query, then again in the background once it is
``ttl_s`` old (a failed read keeps the last one, or none); what is grounded only ever narrows
the caller's own reads (visibility is unchanged), and the service reads again without it when
nothing in the grounded documents answers (services/retrieval/service.py)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.access import Caller
from services.core.normalize import entity_key
from services.core.time_spans import MONTH_NAMES
from services.retrieval.answer_span import FUNCTION_WORDS
from services.retrieval.filters import MAX_VALUES, Filters
from services.retrieval.visibility import Filtered, alias_visible

log = logging.getLogger(__name__)

MAX_VALUE_CHARS = 100
MIN_FORM_CHARS = 3
MAX_VALUES_PER_FIELD = 5000  # the most frequent; bounds the vocabulary's memory
_SEPARATORS = re.compile(r"\s+(?:\||-|–|—|:)\s+")
# A key a filter can name as itself: no dot (a filter reads a dot as a nested path).
_KEY = re.compile(r"^[^.\x00-\x1f\x7f]{1,200}$")
_CAPITAL = re.compile(r"[A-Z]")

# Who a question says its facts come from: a name (capitalised words, "The" allowed) before a
# word for a piece of writing, or after "from / by" one (or "another / one from, by, in"), or
# after "reported by" or "published by" ("according to" names people as often as sources).
_NAME = r"['‘\"]?(?P<name>(?:The\s+)?[A-Z][\w&.’-]*(?:\s+(?:of\s+)?[A-Z][\w&.’-]*)*)['’\"]?"
_WORK = r"(?:article|report|piece|review|story|coverage|post|analysis|column|editorial)s?(?![-\w])"
_ATTRIBUTED = (
    re.compile(rf"(?<!['’\w]){_NAME}\s+{_WORK}\b"),
    re.compile(rf"\b{_WORK}\s+(?:from|by)\s+{_NAME}"),
    re.compile(rf"\b(?:another|one)\s+(?:from|by|in)\s+{_NAME}"),  # "another [article] by X"
    re.compile(rf"\b(?:reported|published)\s+by\s+{_NAME}"),
)
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_CALENDAR = frozenset((*MONTH_NAMES, *_DAYS, *(m[:3] for m in MONTH_NAMES), "Sept"))

_VOCABULARY = text(
    "WITH v AS (SELECT d.tenant, e.key, e.value #>> '{}' AS value, count(*) AS n"
    " FROM documents d, jsonb_each(d.metadata) e"
    " WHERE NOT d.deleted AND jsonb_typeof(e.value) = 'string' GROUP BY 1, 2, 3),"
    " f AS (SELECT key, count(DISTINCT value) AS distinct_values, sum(n) AS docs FROM v"
    "  GROUP BY key)"
    " SELECT v.tenant, v.key, v.value, f.distinct_values FROM v JOIN f USING (key)"
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
    return {
        f
        for f in out
        if len(f) >= MIN_FORM_CHARS and _CAPITAL.search(f) and f.lower() not in FUNCTION_WORDS
    }


@dataclass(frozen=True)
class Grounding:
    """What a question was grounded to: the filter, its field, and the question's own words
    that named its values (what the response may say)."""

    filters: Filters
    field: str
    names: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.field} named {', '.join(repr(n) for n in self.names)}"


Named = Mapping[str, Mapping[str, frozenset[str]]]  # field -> form -> values


@dataclass(frozen=True)
class _Index:
    """What the per-question rules read of one view of the vocabulary, built with it: every
    form, longest first (masking known names), and per field the values each form names with
    case and a leading "The" aside (a classifier's names)."""

    longest_first: tuple[str, ...] = ()
    folded: Mapping[str, Mapping[str, frozenset[str]]] = field(default_factory=dict)

    @classmethod
    def of(cls, named: Named) -> _Index:
        forms_ = sorted({f for by_form in named.values() for f in by_form}, key=len)[::-1]
        folded: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for key, by_form in named.items():
            for form, values in by_form.items():
                folded[key][_fold(form)] |= values
        return cls(tuple(forms_), _frozen(folded))


@dataclass(frozen=True)
class Vocabulary:
    """Per tenant (None: the untenanted documents), per facet field, the values each form
    names; and each field's number of distinct values."""

    named: Mapping[str | None, Named]
    sizes: Mapping[str, int]
    everyone: Named = field(default_factory=dict)  # every tenant's: the operator's view
    # Fields whose values are mostly names in words (a lower-case letter: "The Verge",
    # "TechCrunch"), not codes ("P466"): the fields a question can name a source of.
    worded: frozenset[str] = frozenset()
    indexes: Mapping[str | None, _Index] = field(default_factory=dict)  # per tenant
    everyone_index: _Index = field(default_factory=_Index)

    @classmethod
    def of(cls, rows: Iterable[tuple[str | None, str, str, int]]) -> Vocabulary:
        """From (tenant, field, value, distinct values of the field) rows of facet fields,
        most frequent values first."""
        named: dict[str | None, dict[str, dict[str, set[str]]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(set))
        )
        merged: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        sizes: dict[str, int] = {}
        kept: dict[tuple[str | None, str], int] = defaultdict(int)
        words: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # key -> [worded, values]
        for tenant, key, value, distinct in rows:
            if not _KEY.match(key) or kept[tenant, key] >= MAX_VALUES_PER_FIELD:
                continue
            sizes[key] = distinct
            kept[tenant, key] += 1
            words[key][0] += any(ch.islower() for ch in value)
            words[key][1] += 1
            for form in forms(value):
                named[tenant][key][form].add(value)
                merged[key][form].add(value)
        worded = frozenset(k for k, (w, n) in words.items() if 2 * w > n)
        views = {t: _frozen(fields) for t, fields in named.items()}
        everyone = _frozen(merged)
        return cls(
            views,
            sizes,
            everyone,
            worded,
            {t: _Index.of(view) for t, view in views.items()},
            _Index.of(everyone),
        )

    def visible_to(self, caller: Caller) -> Named:
        """The values of the caller's tenant (the operator's: every tenant's)."""
        return self.everyone if caller.admin else self.named.get(caller.tenant, {})

    def _index(self, caller: Caller) -> _Index:
        return self.everyone_index if caller.admin else self.indexes.get(caller.tenant, _Index())

    def unknown_sources(self, question: str, caller: Caller) -> list[str]:
        """The names a question attributes its facts to ("a Bloomberg article", "a report by
        Reuters", "another by Forbes") that no value of the caller's facets has as a
        form, when the caller's documents have facets at all: what the collection does not
        hold (see the module docstring)."""
        named = self.visible_to(caller)
        if not self.worded & set(named):
            return []  # no field of names in words: nothing says which sources exist
        masked = question
        # A known value's words are not an unknown name's; the longest forms first, so that a
        # section ("FOX News - Health") is masked whole before its head ("FOX News").
        for form in self._index(caller).longest_first:
            if form in masked:
                masked = re.sub(rf"(?<!\w){re.escape(form)}(?!\w)", " ; ", masked)
        found: list[str] = []
        for pattern in _ATTRIBUTED:
            for m in pattern.finditer(masked):
                name = m.group("name").strip().strip("'‘’\"")
                bare = name[4:] if name.startswith("The ") else name
                if (
                    len(bare) < MIN_FORM_CHARS
                    or bare.endswith(("'s", "’s"))
                    or bare.lower() in FUNCTION_WORDS
                    or bare.split()[0] in _CALENDAR
                    or name in found
                ):
                    continue
                found.append(name)
        return found

    def ground(self, question: str, caller: Caller) -> Grounding | None:
        """What the question's named values make (None when it names none)."""
        found: dict[str, tuple[set[str], set[str]]] = {}
        for key, by_form in self.visible_to(caller).items():
            spans = [
                (m.start(), m.end(), form)
                for form in by_form
                if form in question  # most forms are not: no pattern for them
                for m in re.finditer(rf"(?<!\w){re.escape(form)}(?!\w)", question)
            ]
            inside = {s for s in spans for t in spans if t != s and t[0] <= s[0] and s[1] <= t[1]}
            kept = [s for s in spans if s not in inside]
            values = {v for s in kept for v in by_form[s[2]]}
            if not values or len(values) > MAX_VALUES:  # none, or too many to say which
                continue
            found[key] = (values, {s[2] for s in kept})
        return self._grounding(found)

    def ground_names(self, names: Sequence[str], caller: Caller) -> Grounding | None:
        """What the sources an LLM classifier read in the question make: each name taken as a
        form of a value, case and a leading "The" aside (None when none is one)."""
        found: dict[str, tuple[set[str], set[str]]] = {}
        for key, folded in self._index(caller).folded.items():
            hits = [(n, folded[_fold(n)]) for n in names if _fold(n) in folded]
            named = {v for _, vs in hits for v in vs}
            if named and len(named) <= MAX_VALUES:
                found[key] = (named, {n for n, _ in hits})
        return self._grounding(found)

    def unheld_names(self, names: Sequence[str], caller: Caller) -> list[str]:
        """Of the sources an LLM classifier read in the question, those no value of the
        caller's facets is (as ``unknown_sources`` judges the rule's names)."""
        named = self.visible_to(caller)
        if not self.worded & set(named):
            return []
        folded = self._index(caller).folded
        return [n for n in names if not any(_fold(n) in by_form for by_form in folded.values())]

    def _grounding(self, found: Mapping[str, tuple[set[str], set[str]]]) -> Grounding | None:
        """The one field with the most named values (ties: fewer distinct values), as any of
        them."""
        if not found:
            return None
        key = max(found, key=lambda k: (len(found[k][0]), -self.sizes.get(k, 0), k))
        values, names = found[key]
        filters = Filters.model_validate({"metadata": {key: sorted(values)}})
        return Grounding(filters, key, tuple(sorted(names)))


# Names the caller's documents mention (an alias of an entity they mention): a source the
# collection talks about may be what the question means by the name, so it is not missing.
_MENTIONED = Filtered.of(
    "SELECT DISTINCT a.alias_key FROM aliases a WHERE a.alias_key = ANY(:keys)",
    "SELECT DISTINCT a.alias_key FROM aliases a WHERE a.alias_key = ANY(:keys) AND "  # noqa: S608 - a constant fragment
    + alias_visible("a"),
)


async def unmentioned(conn: AsyncConnection, caller: Caller, names: Sequence[str]) -> list[str]:
    """Those of ``names`` that no document the caller may read mentions (by an entity's
    alias, "The" aside)."""
    if not names:
        return []
    keys = {n: entity_key(n[4:] if n.startswith("The ") else n) for n in names}
    rows = await conn.execute(*_MENTIONED.bind(caller, {"keys": sorted(set(keys.values()))}))
    seen = {str(r[0]) for r in rows.all()}
    return [n for n in names if keys[n] not in seen]


def _fold(name: str) -> str:
    """A name as a classifier may write it: case, spacing and a leading "The" aside."""
    words = name.casefold().split()
    return " ".join(words[1:] if words[:1] == ["the"] and len(words) > 1 else words)


def _frozen(fields: Mapping[str, Mapping[str, set[str]]]) -> Named:
    return {k: {f: frozenset(v) for f, v in by.items()} for k, by in fields.items()}


@dataclass
class FacetCache:
    """The vocabulary: read on the first query of the process, in its transaction; then, once
    it is ``ttl_s`` old, read again in the background (one read at a time, on a connection of
    its own) while queries use the one they have."""

    ttl_s: float = 60.0
    _value: Vocabulary | None = None
    _at: float | None = None  # when it was last read (or tried)
    _refresh: asyncio.Task[None] | None = None

    async def get(self, conn: AsyncConnection) -> Vocabulary:
        """The vocabulary as it is now; a read that fails keeps the last one (or none) until
        the next interval, and the query goes on."""
        now = time.monotonic()
        stale = self._at is None or now - self._at > self.ttl_s
        if self._value is None and stale:
            self._at = now
            try:
                async with conn.begin_nested():
                    await self._read(conn)
            except Exception as exc:  # noqa: BLE001 - grounding is an aid, never a failure
                log.warning("the metadata vocabulary was not read: %s", exc)
        elif stale and self._refresh is None:
            self._at = now
            self._refresh = asyncio.create_task(self._again(conn.engine))
        return self._value or Vocabulary({}, {})

    async def _again(self, engine: AsyncEngine) -> None:
        try:
            async with engine.connect() as conn:
                await self._read(conn)
        except Exception as exc:  # noqa: BLE001 - the last vocabulary stays
            log.warning("the metadata vocabulary was not read again: %s", exc)
        finally:
            self._refresh = None

    async def _read(self, conn: AsyncConnection) -> None:
        rows = (await conn.execute(_VOCABULARY, {"max_chars": MAX_VALUE_CHARS})).all()
        self._value = Vocabulary.of(
            (None if r[0] is None else str(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in rows
        )
