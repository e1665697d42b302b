"""Grounding: which entities of the graph does the question name? Exact normalised-key and
alias matches for the question's n-grams and extracted spans, trigram matches for the spans;
each seed is weighted by an IDF over the passages that mention it."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.normalize import entity_key
from services.retrieval.lexical import CorpusStats
from services.retrieval.visibility import Filtered, alias_visible, entity_names

MAX_NGRAM = 5
FUZZY_MIN_SIMILARITY = 0.7  # lower let near-miss names ("Yale University") dilute the seeds
WORD = re.compile(r"[\w'’.-]+", re.UNICODE)  # a question's words, as key_places counts them
_WORD = WORD
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "in",
        "on",
        "at",
        "to",
        "for",
        "from",
        "by",
        "with",
        "and",
        "or",
        "is",
        "was",
        "are",
        "were",
        "be",
        "been",
        "which",
        "who",
        "whom",
        "what",
        "when",
        "where",
        "why",
        "how",
        "did",
        "does",
        "do",
        "that",
        "this",
        "these",
        "those",
        "it",
        "its",
        "as",
        "than",
        "both",
        "same",
        "other",
        "also",
        "their",
        "his",
        "her",
        "they",
        "he",
        "she",
        "film",
        "one",
        "two",
        "first",
    ]
)

# A restricted caller matches visible surfaces only; names and counts come from entity_names.
_EXACT = Filtered.of(
    "SELECT e.id, e.name, e.mention_count, e.key FROM entities e WHERE e.key = ANY(:k)"
    " UNION SELECT e.id, e.name, e.mention_count, a.alias_key FROM aliases a"
    " JOIN entities e ON e.id = a.entity_id WHERE a.alias_key = ANY(:k)",
    "SELECT DISTINCT a.entity_id, '', 0, a.alias_key FROM aliases a WHERE a.alias_key = ANY(:k)"  # noqa: S608 - alias_visible is a constant fragment
    " AND " + alias_visible("a"),
)
# The trigram matches of a span, best first, at most FUZZY_SEEDS entities. A restricted caller
# matches by the aliases its visible documents use: the candidates are read first (the
# trigram index), then visited best first, each alias probed for a visible mention, stopping
# after FUZZY_PROBES visible ones. Best first, the first FUZZY_SEEDS entities met are the best
# FUZZY_SEEDS by their best visible alias, so this is exact whenever the visible rows read name
# that many entities (the fifth column counts the rows read); otherwise the full statement
# runs. The order is stated again above the visibility test (a join may reorder rows; on the
# ordered subquery it costs no sort).
# As one statement with the visibility test among the trigram filter's, the planner costed
# the per-alias probes as a parallel sequential scan of every alias: ~1 s a span at 1M
# entities, for a caller who sees half the documents (docs/BENCHMARKS.md, issue 32 step 4).
FUZZY_SEEDS = 3
FUZZY_PROBES = 64
_FUZZY = Filtered.of(
    "SELECT id, name, mention_count, similarity(name, :s) AS sim, 0 FROM entities"
    " WHERE name % :s ORDER BY sim DESC, id LIMIT :seeds",
    "WITH c AS MATERIALIZED (SELECT a.entity_id, a.alias, similarity(a.alias, :s) AS sim"  # noqa: S608 - alias_visible is a constant fragment
    " FROM aliases a WHERE a.alias % :s),"
    " v AS (SELECT o.entity_id, o.sim FROM (SELECT * FROM c ORDER BY c.sim DESC, c.entity_id"
    " OFFSET 0) o WHERE " + alias_visible("o") + " ORDER BY o.sim DESC, o.entity_id LIMIT :probes)"
    " SELECT v.entity_id, '', 0, max(v.sim) AS sim, (SELECT count(*) FROM v) FROM v"
    " GROUP BY v.entity_id ORDER BY sim DESC, v.entity_id LIMIT :seeds",
)
_FUZZY_EVERY = Filtered.of(
    "SELECT 1",  # never bound for an admin or whole-corpus caller: their statement is exact
    "SELECT a.entity_id, '', 0, max(similarity(a.alias, :s)) AS sim, 0 FROM aliases a"  # noqa: S608 - alias_visible is a constant fragment
    " WHERE a.alias % :s AND "
    + alias_visible("a")
    + " GROUP BY a.entity_id ORDER BY sim DESC, a.entity_id LIMIT :seeds",
)


async def fuzzy_matches(conn: AsyncConnection, span: str, caller: Caller) -> list[Any]:
    """(entity, name, mentions, similarity, _) rows of the span's best trigram matches."""
    values = {"s": span, "seeds": FUZZY_SEEDS, "probes": FUZZY_PROBES}
    rows = list((await conn.execute(*_FUZZY.bind(caller, values))).all())
    if rows and len(rows) < FUZZY_SEEDS and int(rows[0][4]) >= FUZZY_PROBES:
        rows = list((await conn.execute(*_FUZZY_EVERY.bind(caller, values))).all())
    return rows


@dataclass
class Grounding:
    """Entities found in the question, with their seed weights (IDF-like)."""

    weights: dict[int, float] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)

    def ranked_names(self) -> list[str]:
        """Names, heaviest seed first."""
        return [self.names[e] for e in sorted(self.weights, key=lambda e: (-self.weights[e], e))]


def question_keys(question: str, spans: Iterable[str]) -> set[str]:
    """Normalised keys of the question's n-grams and extracted spans that may name entities."""
    return set(key_places(question, spans))


async def exact_matches(
    conn: AsyncConnection, keys: Iterable[str], caller: Caller
) -> Sequence[Any]:
    """(id, name, mention count, matched key) of the entities whose name or alias has one of
    these keys, as the caller may see them (a restricted caller: name '' and count 0)."""
    return (await conn.execute(*_EXACT.bind(caller, {"k": sorted(keys)}))).all()


def key_places(question: str, spans: Iterable[str]) -> dict[str, set[tuple[int, int]]]:
    """Each candidate key with the word ranges [start, end) where the question says it (an
    extracted span found nowhere in the question's words has no range)."""
    words = _WORD.findall(question)
    places: dict[str, set[tuple[int, int]]] = {}
    for span in spans:
        if key := entity_key(span):
            places.setdefault(key, set()).update(_occurrences(words, _WORD.findall(span)))
    for n in range(1, MAX_NGRAM + 1):
        for i in range(len(words) - n + 1):
            gram = words[i : i + n]
            if all(w.lower() in STOPWORDS for w in gram):
                continue
            if n == 1 and (len(gram[0]) < 3 or gram[0].islower()):
                continue
            if key := entity_key(" ".join(gram)):
                places.setdefault(key, set()).add((i, i + n))
    return places


def _occurrences(words: Sequence[str], part: Sequence[str]) -> set[tuple[int, int]]:
    n = len(part)
    low = [w.lower() for w in words]
    want = [w.lower() for w in part]
    return {(i, i + n) for i in range(len(words) - n + 1) if n and low[i : i + n] == want}


def subsumed(matched: Iterable[str], places: dict[str, set[tuple[int, int]]]) -> set[str]:
    """The matched keys said only inside a longer matched name ("Leland" and "North Carolina"
    in "Leland, North Carolina"): longest match wins, the entity-linking rule for overlaps.
    A key said anywhere on its own, or with no known place, is not subsumed."""
    ranges = {r for k in matched for r in places.get(k, ())}
    out = set()
    for key in matched:
        own = places.get(key, set())
        if own and all(
            any(a <= i and j <= b and (b - a) > (j - i) for a, b in ranges) for i, j in own
        ):
            out.add(key)
    return out


def seed_weight(similarity: float, mentions: int, total_chunks: int, linked: float = 1.0) -> float:
    """Match quality × IDF of the entity over passages (rare names say more) × the probability
    that the question's words name it (``link_probability``)."""
    return similarity * linked * math.log((total_chunks + 1) / (mentions + 1) + 1.0)


def link_probability(mentions: int, occurrences: int) -> float:
    """How likely the matched words name this entity where they occur: its mentions over the
    passages whose text holds the words (Mihalcea and Csomai's keyphraseness, "Wikify!", 2007:
    how often a phrase is a link where it appears), at most 1. A real name is nearly always
    its entity's mention (Toronto, CKIS-FM: 1); a common word that is also a rare entity's
    name is almost never ("city", said in thousands of passages, names the film "City" in
    one). Words the text never holds as written (0: an alias normalised differently) count 1.
    Without it, a growing corpus gave every common word of a question a rare, and so heavy,
    seed (docs/retrieval.md, "Quality as the corpus grows")."""
    if occurrences <= 0:
        return 1.0
    return min(1.0, mentions / occurrences)


async def ground(
    conn: AsyncConnection,
    question: str,
    spans: Sequence[str],
    stats: CorpusStats,
    *,
    caller: Caller,
) -> Grounding:
    """Exact key/alias matches for n-grams and spans (a name said only inside a longer
    matched name is not a seed), trigram matches for the extracted spans that match no key
    exactly (misspellings and variants; a span that names an entity exactly is grounded), for
    entities the caller can see, by the names it can see."""
    places = key_places(question, spans)
    rows = await exact_matches(conn, places, caller)
    matched = {str(r[3]) for r in rows}
    inside = subsumed(matched, places)
    kept = matched - inside
    found: dict[int, tuple[str, int, float]] = {}
    said: dict[int, set[str]] = {}  # the words that matched each entity
    for r in rows:
        if str(r[3]) in kept:
            found[int(r[0])] = (str(r[1]), int(r[2]), 1.0)
            said.setdefault(int(r[0]), set()).add(str(r[3]))
    for span in dict.fromkeys(spans):
        if entity_key(span) in matched:  # named exactly (or inside a longer exact name)
            continue
        for r in await fuzzy_matches(conn, span, caller):
            if float(r[3]) >= FUZZY_MIN_SIMILARITY and int(r[0]) not in found:
                found[int(r[0])] = (str(r[1]), int(r[2]), float(r[3]))
                said.setdefault(int(r[0]), set()).add(span)
    if not caller.unfiltered:
        named = await entity_names(conn, caller, list(found))
        found = {e: (*named[e], sim) for e, (_, _, sim) in found.items() if e in named}
    phrases = sorted({p for ps in said.values() for p in ps})
    occurs = await stats.phrases.of(conn, phrases)  # no statement when there are none
    out = Grounding()
    for eid, (name, mentions, sim) in found.items():
        # the most specific words that matched it: a name said in full beside an ambiguous alias
        linked = max(link_probability(mentions, occurs.get(p, 0)) for p in said[eid])
        out.weights[eid] = seed_weight(sim, mentions, stats.chunks, linked)
        out.names[eid] = name
    return out
