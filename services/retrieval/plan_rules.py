"""Questions to typed graph plans, offline, by rule (issue 33): the shapes of seed 002's table
of question types that passages cannot answer. Each rule is what the words say:

- **the operation**: "compare", "difference between", "versus" with two named entities is a
  comparison; "affected", "impact", "depends on", "goes bankrupt", "fails", "disrupt" with a
  named entity is an impact analysis (everything downstream, up to three hops); "most",
  "fewest", "top" ranks by degree; "how many" counts; otherwise the entities are listed.
- **the start**: the entities the question names (exact names or aliases the caller can see,
  the longest match where names overlap), in the order it names them; a ranking question that
  names none starts from the type its head noun asks for.
- **the relationship**: a relationship type of the graph whose words the question uses (first
  five letters: "suppliers" says SUPPLIES, "approved" APPROVED); co-occurrence is never one.
  Its direction from the start entity: a word said before the name asks for what points at it
  ("the suppliers of X", "who approved X": in), after it for what it points at ("X supplies",
  "is X party to": out). With no such word, any typed relationship, both ways.
- **the kind kept**: the head noun after "how many" / "which" / "what" / "list the", as the
  offline answer types it (answer_kind.HEAD_NOUNS), and role nouns of organisations
  ("vendors", "suppliers", "customers") as organisations; "who" asks for people, or who acts
  as one (organisations, nations), as the offline answer reads it; a question with no
  relationship word must ask for several of a kind ("which companies ... in EMEA") or count
  them; "what is affected" keeps things of the named entity's own kind.
- **negation**: "not" / "no" / "without" with a second named entity drops what is one step from
  it along the question's relationship.

A plan is only proposed when the question names what it starts from and, but for a comparison,
uses a relationship type of the graph (``GraphWords``): a graph that only knows co-occurrence
cannot count "the suppliers of X". The auto mode routes to a plan only then; otherwise the
question goes to the other modes as before."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.extraction import CO_OCCURS
from services.retrieval.answer_kind import HEAD_NOUNS, OPENINGS, ORGANISATION, ROLE, word_set
from services.retrieval.grounding import WORD, exact_matches, key_places, subsumed
from services.retrieval.plans import (
    MAX_STEPS,
    Direction,
    Exclude,
    Plan,
    Related,
    Result,
    Start,
    Step,
    Where,
)
from services.retrieval.visibility import Filtered, relationship_visible

_WORD = WORD  # the words grounding counts positions in (key_places)
STEM = 5  # words match relationship types on their first five letters, as answers match words
IMPACT_DEPTH = 3  # an impact analysis follows everything downstream the plans allow
RANKED = 5  # a ranking lists its top five
_COMPARE = re.compile(
    r"\b(compare|comparison|differences?|differ|versus|vs\.?|in common|similarities|"
    r"sets? (?:them|it) apart)\b",
    re.I,
)
_IMPACT = re.compile(
    r"\b(affected|affect|impact(?:ed)?|depends? on|dependent on|bankrupt|fails?|failure|"
    r"disrupt(?:ed|ion)?|downstream|goes under|shut(?:s)? down)\b",
    re.I,
)
_RANK = re.compile(r"\b(most|fewest|least|top|largest number|highest number)\b", re.I)
_COUNT = re.compile(r"^\s*(?:(?:to|for|in|with|from|of|by|on|at)\s+)?how many\b", re.I)
_NOT = re.compile(r"\b(not|no|without|never)\b", re.I)
_WHO = re.compile(r"^\s*(who|whom)\b", re.I)
# organisations named by their role in a trade
ROLE_NOUNS = word_set(
    "vendor vendors supplier suppliers manufacturer manufacturers customer customers buyer "
    "buyers seller sellers partner partners subsidiary subsidiaries competitor competitors "
    "firm firms business businesses"
)
# Roles of a trade by the relationship they take part in: the agent of supplying or selling
# (a vendor supplies something), or its recipient (a customer is supplied). "The vendors"
# keeps the entities that have such a relationship, "with no supplier" those that lack one.
SELLING = ("suppl", "sell")  # the stems of the relationship a trade's roles are read through
AGENTS = word_set("vendor vendors supplier suppliers seller sellers")
RECIPIENTS = word_set("customer customers buyer buyers client clients")
# Words that say a trade's relationship under another name: its converse ("X buys from Y": Y
# supplies X) and "sell" for a graph that says "supply". Each maps to the stems it says and
# whether it says them reversed. ("Signed" is not read as PARTY_TO: "the companies X signed
# contracts with" is two steps through the contract.)
SENSES: dict[str, tuple[tuple[str, ...], bool]] = {
    **dict.fromkeys(
        word_set("buy buys bought buying purchase purchases purchased purchasing"),
        (SELLING, True),
    ),
    **dict.fromkeys(word_set("sell sells sold selling"), (SELLING, False)),
}
# Kinds a question may say are absent beyond the head nouns' ("no contract"): a signed legal
# document is spaCy's LAW. Only here: as a head noun, "contract" would keep LAW entities
# where the offline extractor labels a contract named in text as an organisation.
ABSENT_KINDS: dict[str, tuple[str, ...]] = {
    **{noun: tiers[0] for noun, tiers in HEAD_NOUNS.items()},
    **dict.fromkeys(word_set("contract contracts agreement agreements"), ("LAW",)),
}
_NEGATED = 3  # words after "no" / "without" read for what is absent ("no signed contract")
_OPENERS = word_set("how many which what list name")
_FUNCTION = word_set("in to of by for on at the a an with from as is")


@dataclass(frozen=True)
class Said:
    """An entity the question names: the words as said and where (word positions)."""

    words: str
    start: int
    end: int


# The distinct types by a loose index scan of relationships_type (alembic 0027): one probe per
# type, not a scan of every relationship.
_TYPES = text(
    "WITH RECURSIVE t(type) AS ((SELECT type FROM relationships ORDER BY type LIMIT 1)"
    " UNION ALL SELECT (SELECT r.type FROM relationships r WHERE r.type > t.type"
    " ORDER BY r.type LIMIT 1) FROM t WHERE t.type IS NOT NULL)"
    " SELECT type FROM t WHERE type IS NOT NULL AND type <> :c"
)


@dataclass
class GraphWords:
    """The graph's relationship types (but co-occurrence), read at most every ``ttl_s``."""

    ttl_s: float = 60.0
    types: tuple[str, ...] = ()
    _read_at: float = field(default=-1e18)

    async def get(self, conn: AsyncConnection) -> tuple[str, ...]:
        if time.monotonic() - self._read_at > self.ttl_s:
            rows = await conn.execute(_TYPES, {"c": CO_OCCURS})
            self.types = tuple(sorted(str(r[0]) for r in rows.all()))
            self._read_at = time.monotonic()
        return self.types


VOCABULARY = 50  # the relationship types checked for a restricted caller, one probe each
# The types a restricted caller sees a relationship of (evidence in a visible document, both
# ends visible): each an EXISTS through relationships_type, stopping at the first.
_VISIBLE_TYPES = Filtered.of(
    "SELECT q.t FROM unnest(CAST(:t AS text[])) AS q(t)",
    "SELECT q.t FROM unnest(CAST(:t AS text[])) AS q(t) WHERE EXISTS (SELECT 1"  # noqa: S608 - visibility fragments are constants
    " FROM relationships r WHERE r.type = q.t AND "
    + relationship_visible("r.id", "r.source_id", "r.target_id")
    + ")",
)


async def visible_types(
    conn: AsyncConnection, caller: Caller, types: Sequence[str]
) -> tuple[str, ...]:
    """The relationship types the caller can see a relationship of (the graph's own for an
    operator or whole-corpus caller without filters): what the rules and the model may use,
    so neither a plan nor whether a question is read as one depends on hidden documents."""
    if caller.unfiltered or not types:
        return tuple(types)
    rows = await conn.execute(*_VISIBLE_TYPES.bind(caller, {"t": list(types[:VOCABULARY])}))
    return tuple(sorted(str(r[0]) for r in rows.all()))


async def names_said(conn: AsyncConnection, question: str, caller: Caller) -> list[Said]:
    """The entities the question names, by exact name or alias the caller can see (the
    longest match where two overlap), in the order it names them."""
    places = key_places(question, [])
    if not places:
        return []
    rows = await exact_matches(conn, places, caller)
    matched = {str(r[3]) for r in rows}
    kept = matched - subsumed(matched, places)
    words = _WORD.findall(question)
    found = {(a, b): " ".join(words[a:b]) for key in kept for a, b in places.get(key, ())}
    spans = sorted(found, key=lambda p: (p[0], -(p[1] - p[0])))
    out: list[Said] = []
    for a, b in spans:  # overlapping places: the first, longest one
        if out and a < out[-1].end:
            continue
        out.append(Said(found[(a, b)], a, b))
    return out


def asks_graph(question: str) -> bool:
    """The question's words ask for a count, a ranking, a comparison or an impact analysis
    (what an LLM is asked to write a plan for in auto mode: a call per question otherwise)."""
    return any(p.search(question) for p in (_COUNT, _COMPARE, _IMPACT, _RANK))


def plan_for(question: str, said: Sequence[Said], types: Sequence[str]) -> Plan | None:
    """The plan the question's words state (module docstring), or None; None too when what
    it says does not make a valid plan (a name past the plan's bound, a type it cannot
    name)."""
    try:
        return _plan_for(question, said, types)
    except ValidationError:
        return None


def _plan_for(question: str, said: Sequence[Said], types: Sequence[str]) -> Plan | None:
    words = [w.lower() for w in _WORD.findall(question)]
    names = [s.words for s in said]
    if _COMPARE.search(question) and len(names) >= 2:
        return Plan(start=Start(names=names[:2]), result=Result(op="compare"))
    at, absent = _absent(words, said, types)
    if not types or (at >= 0 and absent is None):
        return None  # no typed graph, or an absence it cannot state (not a plan ignoring it)
    where = _kind(words, question)
    said_rels = [r for r in _relationships(words, said, types) if r.at != at]
    if absent is not None:
        where = Where(**{**(where.model_dump() if where else {}), "lacks": absent.model_dump()})
    if _IMPACT.search(question) and said:
        used = sorted({r.type for r in said_rels})
        step = Step(relationships=used, typed=not used, direction="out", depth=_depth(words))
        kind = where or Where(like_start=True)  # what X's failure affects: things of X's kind
        return Plan(
            start=Start(names=names[:1]), follow=[step], where=kind, result=Result(op="list")
        )
    if _RANK.search(question):
        return _ranked(words, said_rels, said, where)
    counted = bool(_COUNT.search(question))
    if not said or (not said_rels and (where is None or not (counted or _plural(words)))):
        return None  # no named start, or nothing says how to go from it
    first, steps = said[0], _steps(said_rels, said, said[0])
    exclude = None
    if _NOT.search(question) and len(said) >= 2:
        other = said[1]
        away = [r for r in said_rels if _nearest(r.at, said) == other]
        if away:
            exclude = Exclude(
                names=[other.words],
                relationships=sorted({r.type for r in away}),
                direction=_direction(away[0], other),
            )
    op = "count" if counted else "list"
    return Plan(
        start=Start(names=[first.words]),
        follow=steps,
        where=where,
        exclude=exclude,
        result=Result(op=op, limit=200),
    )


@dataclass(frozen=True)
class _Rel:
    """A relationship type a word of the question says, where, and whether it is said in the
    passive ("supplied by X": X is its source)."""

    type: str
    at: int
    passive: bool


def _relationships(words: Sequence[str], said: Sequence[Said], types: Sequence[str]) -> list[_Rel]:
    """Each word of the question (outside the names it says) that says a relationship type of
    the graph, in order."""
    inside = {i for s in said for i in range(s.start, s.end)}
    stems = {
        rel: {w[:STEM] for w in rel.lower().split("_") if w not in _FUNCTION and len(w) > 2}
        for rel in types
    }
    out = []
    for i, w in enumerate(words):
        if i in inside:
            continue
        own_word = any(w[:STEM] in own for own in stems.values())
        senses, reversed_ = SENSES[w] if w in SENSES and not own_word else ((), False)
        for rel, own in stems.items():
            if (w[:STEM] in own) if not senses else any(o.startswith(senses) for o in own):
                passive = w.endswith(("ed", "ght", "old")) and words[i + 1 : i + 2] == ["by"]
                out.append(_Rel(rel, i, passive != reversed_))
                break
    return out


def _typed(stems: tuple[str, ...], types: Sequence[str]) -> str | None:
    """The graph's relationship type one of these stems says (the first in order), if any."""
    for rel in types:
        if any(w.startswith(stems) for w in rel.lower().split("_")):
            return rel
    return None


def _role(noun: str, types: Sequence[str], *, absent: bool = False) -> Related | None:
    """The relationship a trade's role takes part in ("vendors": SUPPLIES out, "customers":
    SUPPLIES in), from the other end when the role is what is absent ("no supplier": nothing
    supplies it); None when the noun is no role or the graph has no such relationship."""
    if noun not in AGENTS and noun not in RECIPIENTS:
        return None
    rel = _typed(SELLING, types)
    if rel is None:
        return None
    agent = (noun in AGENTS) != absent
    return Related(relationships=[rel], direction="out" if agent else "in")


def _absent(
    words: Sequence[str], said: Sequence[Said], types: Sequence[str]
) -> tuple[int, Related | None]:
    """What the question says is absent ("with no contract", "without a supplier") and the
    word saying it (-1: none): the first role or kind noun within a few words after "no" /
    "without" that is not a name it says. A role lacks its relationship (None: the graph has
    none); a kind lacks any typed relationship to an entity of it."""
    inside = {i for s in said for i in range(s.start, s.end)}
    for i, w in enumerate(words):
        if w not in ("no", "without"):
            continue
        for j in range(i + 1, min(len(words), i + 1 + _NEGATED)):
            if j in inside:
                break
            if words[j] in AGENTS or words[j] in RECIPIENTS:
                return j, _role(words[j], types, absent=True)
            labels = ABSENT_KINDS.get(words[j]) or ABSENT_KINDS.get(_singular(words[j]))
            if labels:
                kind = [t for t in labels if t not in ROLE]
                return j, Related(typed=True, direction="both", to_types=kind) if kind else None
    return -1, None


def _nearest(at: int, said: Sequence[Said]) -> Said:
    """The name said nearest a word."""
    return min(said, key=lambda s: (min(abs(at - s.start), abs(at - (s.end - 1))), s.start))


def _direction(rel: _Rel, name: Said) -> Direction:
    """From the name: a relationship word said before it asks for what points at it ("the
    suppliers of X", "who approved X"), after it for what it points at ("X supplies", "does X
    approve"); in the passive ("supplied by X") what X points at."""
    if rel.passive or rel.at > name.start:
        return "out"
    return "in"


def _steps(rels: Sequence[_Rel], said: Sequence[Said], first: Said) -> list[Step]:
    """The steps from the first name: its relationship words, nearest first (each one hop
    further: "who approved the contracts X is party to" is PARTY_TO out, then APPROVED in);
    with none, one hop along any typed relationship, both ways ("the companies in EMEA")."""
    own = sorted(
        (r for r in rels if _nearest(r.at, said) == first),
        key=lambda r: abs(r.at - first.start),
    )[:MAX_STEPS]
    if not own:
        return [Step(typed=True, direction="both")]
    return [Step(relationships=[r.type], direction=_direction(r, first)) for r in own]


_HOPS = re.compile(r"\b(one|two|three|1|2|3)\s+(?:hops?|levels?|steps?|tiers?)\b", re.I)
_NUMBERS = {"one": 1, "two": 2, "three": 3, "1": 1, "2": 2, "3": 3}


def _depth(words: Sequence[str]) -> int:
    """The hops an impact question asks for ("within two hops"), else as far as plans go."""
    found = _HOPS.search(" ".join(words))
    return _NUMBERS[found.group(1).lower()] if found else IMPACT_DEPTH


def _kind(words: Sequence[str], question: str) -> Where | None:
    """The entity types the question asks for: its head noun's (module docstring)."""
    if _WHO.search(question):  # a person, or who acts as one: a company, a nation (answer_kind)
        return Where(types=[t for tier in OPENINGS["who"] for t in tier])
    noun = _singular(_head(words))
    if noun in ROLE_NOUNS:
        return Where(types=list(ORGANISATION))
    if noun in HEAD_NOUNS:
        return Where(types=list(HEAD_NOUNS[noun][0]))
    return None


def _singular(word: str) -> str:
    """A plural in -ies read as its singular ("companies": "company"); HEAD_NOUNS and
    ROLE_NOUNS hold the -s plurals themselves."""
    return word[:-3] + "y" if word.endswith("ies") else word


def _head(words: Sequence[str]) -> str:
    """The head noun after the first opener ("which", "how many", "list the"), as said; ""
    when none."""
    for i, w in enumerate(words[:-1]):
        if w in _OPENERS:
            for said in words[i + 1 : i + 4]:
                if _singular(said) in ROLE_NOUNS or _singular(said) in HEAD_NOUNS:
                    return said
    return ""


def _plural(words: Sequence[str]) -> bool:
    """The head noun asks for several ("which companies", "list the manufacturers"): a list
    over a membership, where one thing ("the capital of France") is a fact, not a list."""
    return _head(words).endswith("s")


def _ranked(
    words: Sequence[str],
    rels: Sequence[_Rel],
    said: Sequence[Said],
    where: Where | None,
) -> Plan | None:
    """ "Which X ... the most Y": X ranked by their relationships of the question's type, out
    of X when the relationship word follows X's noun, else into it. X are the entities of the
    kind asked for, or those one hop from a name the question says ("which APAC company")."""
    if not rels or (where is None and not said):
        return None
    noun = next((i for i, w in enumerate(words) if w in ROLE_NOUNS or w in HEAD_NOUNS), 0)
    direction: Direction = "out" if any(r.at > noun for r in rels) else "in"
    ranked_by = sorted({r.type for r in rels})
    related = Related(relationships=ranked_by, direction=direction)
    result = Result(op="rank", rank_by="degree", related=related, limit=RANKED)
    if not said:
        assert where is not None  # noqa: S101 - checked above
        kept = where if where.has or where.lacks else None  # "which vendor": those that supply
        return Plan(start=Start(types=where.types), where=kept, result=result)
    step = Step(typed=True, direction="both")
    return Plan(start=Start(names=[said[0].words]), follow=[step], where=where, result=result)
