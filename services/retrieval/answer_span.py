"""The offline answer (pure): find what the question asks for in the top contexts.

- span questions: the sentences of the top contexts are scored by the question's words they
  (or their passage's title) contain, each word weighted by its IDF over those contexts; the
  candidates are the entities the indexer found in them (mentions, with their labels) plus the
  dates and numbers in the sentence text. The answer is the candidate of the best tier of the
  expected kind (services/retrieval/answer_kind.py), in the best sentence, nearest the
  question's words, that the question does not already name.
- the next hop: when local mode followed a chain of passages and that span is one of the best
  chain's bridges (mentioned in the chain passage it was read from and in the next one), the
  question asks for something beyond it: the span is read from that next passage instead, its
  sentences scored on the question's words none of the chain's passages up to the bridge has
  (the last sub-question), every name of those passages excluded. Without a candidate of the
  expected kind there, the span stands. (docs/retrieval.md, "Answers from the last hop".)
- choice questions ("..., X or Y?"): the option whose passage has the smaller or larger date or
  number when the question says which ("first", "older", "more"), else the better-matching one.
- yes/no questions: "yes" when each named subject's passage has every word of the predicate,
  or, for "the same ...", when their passages share an entity of that kind.
- time-scoped questions ("from 1811 to 1827", "in 1974", "before 2010"): after the answer's
  kind (a year in a question may describe a name rather than scope the answer: "a house
  founded in 2005, based where?"), a span is read from a sentence that holds in the scope
  before one that states no time, and before one whose times are all outside it
  (services/retrieval/time_scope.py); among those that hold, from the sentence whose time fits
  the scope more closely (``Scope.fit``), and in it the candidate nearest a time that holds (a
  sentence listing "X in 1982, Y in 1988" states each fact beside its year).

Words match on their first five letters (truncation stemming), so "directed" finds "director".
Nothing here is a weight fitted to a dev set: the orderings are lexicographic."""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from services.core.normalize import answer_key as normalise
from services.retrieval.answer_kind import (
    DATE,
    HEAD_NOUNS,
    NUMBER,
    PLACE,
    ROLE,
    AnswerKind,
    classify,
    sentences,
    word_set,
    words,
)
from services.retrieval.schemas import Context
from services.retrieval.time_scope import Scope, question_scope, stated_times

TOP_CONTEXTS = 5  # the answer reads the passages recall@5 measures
STEM = 5  # truncation stemming: the first five letters (words shorter are kept whole)
_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_DATE = re.compile(
    rf"\b(?:(?:\d{{1,2}}\s+)?(?:{_MONTHS})(?:\s+\d{{1,2}})?,?\s+)?(?:1[0-9]{{3}}|20[0-9]{{2}})\b"
)
# Dates written as more than one year: a range or a pair in words ("10 July -- 31 October 1940",
# "1898 and 1959"; not a life span "1505–1572", whose years are asked one at a time), a decade
# ("the 1970s"), a century ("the 15th century"). Answers only: comparisons read _DATE values.
_DAY_MONTH = rf"(?:\d{{1,2}}\s+(?:{_MONTHS})|(?:{_MONTHS})\s+\d{{1,2}})"
_DATE_SPAN = re.compile(
    rf"(?:{_DATE.pattern}|\b{_DAY_MONTH})\s+(?:--|to|and|or)\s+{_DATE.pattern}"
    r"|\b(?:1[0-9]|20)[0-9]0s\b"
    r"|\b\d{1,2}(?:st|nd|rd|th)[\s-]century\b"
)
_NUMBER = re.compile(
    r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?:\s+(?:million|billion|thousand))?"
    r"|(?<![\w.])\d+(?:\.\d+)?(?:\s+(?:million|billion|thousand))?(?![\w.])"
)
# Counts written as words are answers to "how many" too (not compared: no value).
_NUMBER_WORDS = re.compile(
    r"\b(?:once|twice|thrice|(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
    r"(?:-time)?)\b",
    re.IGNORECASE,
)
# A role: the phrase after a copula or an appointment ("was Count of Tripoli", "became a national
# master of the USSR", "served as Minister of Defence"), and each item of a list it opens ("..., an
# International Master in 1988 and an International Grandmaster in 1989"), up to what ends a noun
# phrase there: a time or clause word, or the end of the clause.
_ROLE_OPENS = re.compile(  # a lookahead: an opening inside another's list is found too
    r"(?=\b(?:was|were|is|are|became|becomes|served as|serving as|appointed|named|elected|made"
    r"|as)\s+([^;.()\[\]]+))"
)
_LIST_ITEM = re.compile(r",\s*(?:and\s+)?|\s+and\s+")
_ROLE_ENDS = re.compile(
    r"(?:^|\s+)(?:from|in|since|until|between|during|on|by|after|before|when|while|who|which|where"
    r"|but|to)\b"
)
_ROLE_START = re.compile(r"(?:(?:an?|the)\s+)?[A-Za-z]")
_DISAMBIGUATION = re.compile(r"\s*\([^()]*\)\s*$")
# Words of the question that carry no content for matching sentences.
FUNCTION_WORDS = word_set(
    "a an the of in on at to for from by with and or is was are were be been being which who "
    "whom whose what when where why how did does do that this these those it its as than both "
    "same other also their his her they he she there has have had not but into about"
)


@dataclass(frozen=True)
class Mention:
    """An entity the indexer found in a context's chunk."""

    chunk_id: int
    surface: str
    label: str


@dataclass(frozen=True)
class SpanAnswer:
    """The answer text and the sentence (with its document) it was read from."""

    text: str
    sentence: str
    doc_id: str


@dataclass(frozen=True)
class _Sentence:
    text: str
    rank: int  # of its context
    context: Context
    score: float
    tokens: tuple[str, ...]  # its words' stems
    hits: tuple[int, ...]  # positions in ``tokens`` matching the question


def stem(word: str) -> str:
    """Truncation stem."""
    return word[:STEM]


def content_stems(text: str) -> set[str]:
    """Stems of the content words of a text."""
    return {stem(w) for w in words(text) if w not in FUNCTION_WORDS and len(w) > 1}


def answer_span(
    question: str,
    contexts: Sequence[Context],
    mentions: Iterable[Mention],
    chain: Sequence[int] = (),
) -> SpanAnswer | None:
    """The answer found in the top contexts, or None when nothing of the expected kind is.
    ``chain``: the best chain of passages local mode followed (chunk ids in hop order)."""
    top = list(contexts[:TOP_CONTEXTS])
    if not top:
        return None
    kind = classify(question)
    by_chunk: dict[int, list[Mention]] = {}
    for m in mentions:
        by_chunk.setdefault(m.chunk_id, []).append(m)
    if kind.form == "yesno":
        return _yes_no(question, top, by_chunk)
    scored = _scored_sentences(question, top)
    if kind.form == "choice":
        return _choice(kind, top, scored)
    span = _best_span(kind, question, scored, by_chunk)
    if span is None or not chain:
        return span
    by_id = {c.chunk_id: c for c in contexts}
    hops = [by_id.get(p) for p in chain]
    return _next_hop(kind, question, span, hops, top=top, by_chunk=by_chunk) or span


def _scored_sentences(
    question: str,
    top: Sequence[Context],
    pool: Sequence[Context] = (),
    covered: Collection[str] = frozenset(),
) -> list[_Sentence]:
    """Every sentence of the top contexts with its IDF-weighted overlap with the question's
    words (but the ``covered`` stems); IDF over ``pool`` (default: the top contexts)."""
    asked = content_stems(question) - set(covered)
    docs = [content_stems(c.title + " " + c.text) for c in pool or top]
    n = len(docs)
    idf = {t: math.log(1 + n / df) for t in asked if (df := sum(t in d for d in docs))}
    out = []
    for rank, ctx in enumerate(top):
        title = content_stems(ctx.title)
        for text in sentences(ctx.text):
            tokens = tuple(stem(w) for w in words(text))
            matched = (set(tokens) | title) & set(idf)
            hits = tuple(i for i, t in enumerate(tokens) if t in idf)
            score = sum(idf[t] for t in sorted(matched))  # one order: equal sums tie
            out.append(_Sentence(text, rank, ctx, score, tokens, hits))
    return out


@dataclass(frozen=True)
class _When:
    """How a sentence stands to the question's time scope."""

    rank: int  # 0: it holds in the scope (or there is none); 1: it states no time; 2: outside
    fit: float  # how closely its best time fits the scope (Scope.fit)
    at: tuple[tuple[int, int], ...]  # where it states the times that hold in the scope


def _when(scope: Scope | None, sentence: _Sentence) -> _When:
    """Where the sentence stands to the scope."""
    if scope is None:
        return _When(0, 0.0, ())
    times = stated_times(sentence.text)
    if not times:
        return _When(1, 0.0, ())
    held = [(t, at) for t, at in times if scope.meets([t])]
    if not held:
        return _When(2, 0.0, ())
    return _When(0, scope.fit(t for t, _ in held), tuple(at for _, at in held))


def _candidates(
    sentence: _Sentence, mentions: Sequence[Mention], roles: bool = False
) -> list[tuple[str, str]]:
    """(text, label) of the entities, dates and numbers in a sentence, and its role phrases when
    ``roles``; a place followed by ", <place>" is one place ("Columbus, Ohio"), as addresses
    write it."""
    found = [(m.surface, m.label) for m in mentions if m.surface and m.surface in sentence.text]
    places = [t for t, label in found if label in PLACE]
    found += [
        (f"{a}, {b}", "GPE")
        for a in places
        for b in places
        if a != b and f"{a}, {b}" in sentence.text
    ]
    found += [(d.group(0), DATE[0]) for d in _DATE.finditer(sentence.text)]
    found += [(d.group(0), DATE[0]) for d in _DATE_SPAN.finditer(sentence.text)]
    found += [(n.group(0), NUMBER[0]) for n in _NUMBER.finditer(sentence.text)]
    found += [(n.group(0), NUMBER[0]) for n in _NUMBER_WORDS.finditer(sentence.text)]
    if roles:
        found += [(role, ROLE[0]) for role in role_phrases(sentence.text)]
    return found


def role_phrases(text: str) -> list[str]:
    """The roles a sentence states (module note above ``_ROLE_OPENS``)."""
    out = []
    for opened in _ROLE_OPENS.finditer(text):
        for item in _LIST_ITEM.split(opened.group(1)):
            if _ROLE_OPENS.match(item):
                continue  # "... and served as captain": an opening of its own, read there
            phrase = _ROLE_ENDS.split(item, maxsplit=1)[0].strip()
            if phrase and _ROLE_START.match(phrase) and phrase not in out:
                out.append(phrase)
    return out


def _best_span(
    kind: AnswerKind,
    question: str,
    scored: Sequence[_Sentence],
    by_chunk: dict[int, list[Mention]],
    excluded: Collection[str] = frozenset(),
) -> SpanAnswer | None:
    """The candidate of the best tier, in a sentence that holds in the question's time scope,
    the one that fits it best, then the best sentence, nearest a time that holds (else the
    question's words); none the question names, nor any of the ``excluded`` (normalised) names."""
    asked = f" {normalise(question)} "
    scope = question_scope(question)
    roles = ROLE in kind.tiers
    best: tuple[tuple[float, ...], str, _Sentence] | None = None
    for sentence in scored:
        if sentence.score <= 0:
            continue
        when = _when(scope, sentence)
        mentioned = by_chunk.get(sentence.context.chunk_id, [])
        for text, label in _candidates(sentence, mentioned, roles):
            tier = _tier(kind, label)
            said = normalise(text)
            if tier is None or not said or f" {said} " in asked or said in excluded:
                continue
            # the longer of two otherwise equal spans is the more specific ("Columbus, Ohio")
            key = (
                tier,
                when.rank,
                -when.fit,
                -sentence.score,
                _distance(sentence, text, when.at),
                -len(text),
                sentence.rank,
            )
            if best is None or key < best[0]:
                best = (key, text, sentence)
    if best is None:
        return None
    _, text, sentence = best
    return SpanAnswer(text, sentence.text, sentence.context.doc_id)


def _next_hop(
    kind: AnswerKind,
    question: str,
    span: SpanAnswer,
    chain: Sequence[Context | None],
    *,
    top: Sequence[Context],
    by_chunk: dict[int, list[Mention]],
) -> SpanAnswer | None:
    """The span of the chain passage after the one ``span`` was read from, when ``span`` is the
    bridge between them (module docstring); None otherwise. ``chain``: its passages in hop
    order, None for those not among the contexts."""
    said = normalise(span.text)
    for i in range(len(chain) - 1):
        here, there = chain[i], chain[i + 1]
        if here is None or there is None or here.doc_id != span.doc_id:
            continue
        if said not in _names(here, by_chunk) or said not in _names(there, by_chunk):
            continue
        earlier = [c for c in chain[: i + 1] if c is not None]
        covered = set().union(*(content_stems(c.title + " " + c.text) for c in earlier))
        named = set().union(*(_names(c, by_chunk) for c in earlier))
        pool = list({c.chunk_id: c for c in [*top, there]}.values())
        scored = _scored_sentences(question, [there], pool, covered)
        found = _best_span(kind, question, scored, by_chunk, named)
        if found is not None:
            return found
    return None


def _names(ctx: Context, by_chunk: dict[int, list[Mention]]) -> set[str]:
    """The normalised names the indexer found in a context."""
    return {normalise(m.surface) for m in by_chunk.get(ctx.chunk_id, [])}


def _tier(kind: AnswerKind, label: str) -> int | None:
    """Index of the label's tier in the expected kind (None: not acceptable). Without an
    expected kind, any entity is tier 0 and bare dates and numbers are not answers."""
    if not kind.tiers:
        return None if label in (DATE[0], NUMBER[0]) else 0
    for i, tier in enumerate(kind.tiers):
        if label in tier:
            return i
    return None


def _distance(sentence: _Sentence, text: str, times: Sequence[tuple[int, int]] = ()) -> float:
    """Words between the candidate and the nearest time that holds in the question's scope
    (``times``: where the sentence states them), else the nearest word matching the question."""
    if times and (start := sentence.text.find(text)) >= 0:
        end = start + len(text)
        gaps = (sentence.text[end:a] if end <= a else sentence.text[b:start] for a, b in times)
        return float(min(len(words(gap)) for gap in gaps))
    first = stem(words(text)[0]) if words(text) else ""
    where = [i for i, t in enumerate(sentence.tokens) if t == first]
    if not where or not sentence.hits:
        return float(len(sentence.tokens))
    return float(min(abs(i - h) for i in where for h in sentence.hits))


def bare_title(ctx: Context) -> str:
    """The normalised title without a trailing disambiguation ("Pick Me Up (magazine)")."""
    return normalise(_DISAMBIGUATION.sub("", ctx.title))


def _passage_of(option: str, top: Sequence[Context]) -> Context | None:
    """The context about an option: its title is the option (or contains it, or the reverse),
    else the first context that mentions it."""
    said = normalise(option)
    titles = [(bare_title(c), c) for c in top]
    for title, ctx in titles:
        if title == said:
            return ctx
    for title, ctx in titles:
        if title and (said in title or title in said):
            return ctx
    return next((c for c in top if said in normalise(c.text)), None)


def _first_value(text: str, basis: str) -> float | None:
    """The first year (dates) or number in a passage."""
    if basis == "date":
        for d in _DATE.finditer(text):
            return float(d.group(0)[-4:])
        return None
    for n in _NUMBER.finditer(text):
        value = float(n.group(0).split()[0].replace(",", ""))
        scale = n.group(0).split()[1:] or [""]
        return value * {"million": 1e6, "billion": 1e9, "thousand": 1e3}.get(scale[0], 1.0)
    return None


def _choice(
    kind: AnswerKind, top: Sequence[Context], scored: Sequence[_Sentence]
) -> SpanAnswer | None:
    """One of the named options."""
    passages = [(option, _passage_of(option, top)) for option in kind.options]
    found = [(o, p) for o, p in passages if p is not None]
    if not found:
        return None
    if kind.direction and len(found) == len(kind.options):
        values = [(_first_value(p.text, kind.basis), o, p) for o, p in found]
        if all(v is not None for v, _, _ in values):
            pick = min if kind.direction == "min" else max
            _, option, ctx = pick(values, key=lambda v: v[0] or 0.0)
            return SpanAnswer(option, _first_sentence(ctx), ctx.doc_id)
    # No direction (or no values): the option whose passage matches the question best.
    score = {id(s.context): 0.0 for s in scored}
    for s in scored:
        score[id(s.context)] = max(score[id(s.context)], s.score)
    option, ctx = max(found, key=lambda f: score.get(id(f[1]), 0.0))
    return SpanAnswer(option, _first_sentence(ctx), ctx.doc_id)


def _first_sentence(ctx: Context) -> str:
    parts = sentences(ctx.text)
    return parts[0] if parts else ctx.text[:200]


def _yes_no(
    question: str,
    top: Sequence[Context],
    by_chunk: dict[int, list[Mention]],
) -> SpanAnswer | None:
    """ "yes" or "no" from the passages of the subjects the question names (the top contexts
    whose titles occur in it)."""
    asked = f" {normalise(question)} "
    subjects = [c for c in top if bare_title(c) and f" {bare_title(c)} " in asked][:2]
    if not subjects:
        return None
    named = set().union(*(content_stems(bare_title(c)) for c in subjects))
    predicate = content_stems(question) - named - {stem(w) for w in ("both", "same")}
    tokens = words(question)
    if "same" in tokens:
        after = [HEAD_NOUNS[n] for n in tokens[tokens.index("same") + 1 :] if n in HEAD_NOUNS]
        labels = set(after[0][0]) if after else set()
        if labels and len(subjects) == 2:
            sets = [
                {normalise(m.surface) for m in by_chunk.get(c.chunk_id, []) if m.label in labels}
                for c in subjects
            ]
            verdict = "yes" if sets[0] & sets[1] else "no"
            return SpanAnswer(verdict, _first_sentence(subjects[0]), subjects[0].doc_id)
    if not predicate:
        return None
    # A "yes" needs every asked property in every subject's passage.
    has = [len(predicate & content_stems(c.text)) / len(predicate) for c in subjects]
    verdict = "yes" if all(h == 1.0 for h in has) else "no"
    weakest = subjects[has.index(min(has))]
    return SpanAnswer(verdict, _first_sentence(weakest), weakest.doc_id)
