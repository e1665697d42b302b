"""Lexical retrieval: BM25 over the chunks' full-text vectors (``chunks.tsv``, english config).

PostgreSQL's ts_rank has no inverse document frequency, which is most of what makes BM25 work
on entity-heavy questions, so the score is computed here: candidates come from the GIN index
(any question lexeme), document frequencies from the same index, term frequencies from the
stored positions. Lexemes in more than half of the chunks are dropped (BM25 gives them ~0).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.retrieval.visibility import VISIBLE_DOC_IDS, Filtered

K1 = 1.2
B = 0.75
MAX_CANDIDATES = 1000  # postings scored at most (rarest terms first): bounds the latency

_LEXEMES = text("SELECT unnest(tsvector_to_array(to_tsvector('english', :q)))")
FREQUENCIES_SQL = (
    "SELECT l.lexeme, (SELECT count(*) FROM chunks c WHERE c.tsv @@ to_tsquery('simple',"
    " quote_literal(l.lexeme))) FROM unnest(CAST(:lex AS text[])) AS l(lexeme)"
)
_DOCUMENT_FREQUENCIES = text(FREQUENCIES_SQL)
# Chunks whose text holds each phrase (its words in order, as full-text search reads them): how
# often a name's words occur at all, against how often they name the entity (grounding.py).
PHRASE_FREQUENCIES_SQL = (
    "SELECT l.phrase, (SELECT count(*) FROM chunks c WHERE c.tsv @@ phraseto_tsquery('english',"
    " l.phrase)) FROM unnest(CAST(:lex AS text[])) AS l(phrase)"
)
PHRASE_FREQUENCIES = text(PHRASE_FREQUENCIES_SQL)
MAX_CACHED_LEXEMES = 50_000  # a memory bound (a few MB), not a tuning knob
STATS_SQL = "SELECT count(*), coalesce(avg(length(tsv)), 1) FROM chunks c"
_STATS = text(STATS_SQL)
_CANDIDATES = (
    "WITH q AS (SELECT * FROM unnest(CAST(:lex AS text[]), CAST(:idf AS float8[]))"
    "  AS q(lexeme, idf)),"
    " cand AS (SELECT c.id, c.tsv FROM chunks c"
    "  WHERE c.tsv @@ CAST(:query AS tsquery)"
)
_BM25 = (
    ")"
    " SELECT cand.id, sum(q.idf * (tf * (:k1 + 1)) / (tf + :k1 * (1 - :b + :b * length(cand.tsv)"
    "  / :avglen))) AS score"
    " FROM cand CROSS JOIN LATERAL unnest(cand.tsv) AS u(lexeme, positions, weights)"
    " JOIN q ON q.lexeme = u.lexeme"
    " CROSS JOIN LATERAL (SELECT coalesce(array_length(u.positions, 1), 1)::float8 AS tf) t"
    " GROUP BY cand.id ORDER BY score DESC, cand.id LIMIT :k"
)
# Document frequencies and lengths stay corpus-wide (docs/access-control.md): aggregate
# statistics, not text; the candidates are the caller's visible chunks only.
SCORE_SQL = _CANDIDATES + _BM25
SCORE_VISIBLE_SQL = _CANDIDATES + " AND c.doc_id IN (" + VISIBLE_DOC_IDS + ")" + _BM25
SCORE = Filtered.of(SCORE_SQL, SCORE_VISIBLE_SQL)
# Which of the question's lexemes each chunk contains (a chain step must add one: see chains.py):
# one index-free match per lexeme and chunk, cheaper than listing every chunk's lexemes.
# Which of the :lex lexemes chunk c contains (an array expression over a row of chunks c).
TERMS_OF_CHUNK = (
    "ARRAY(SELECT l.lexeme FROM unnest(CAST(:lex AS text[])) AS l(lexeme)"
    " WHERE c.tsv @@ to_tsquery('simple', quote_literal(l.lexeme)))"
)
_SHARED_TERMS = text(f"SELECT c.id, {TERMS_OF_CHUNK} FROM chunks c WHERE c.id = ANY(:ids)")  # noqa: S608 - a constant


# A lexeme's count is reused until the corpus has changed by this share of its chunks since it
# was counted: its IDF, log((n - df) / df), then moves by about as much, less than BM25's
# scores move between two refreshes of the chunk count. 1% is also what "barely moves in half a
# minute" meant for the refresh below, made a count of chunks instead of seconds.
DF_DRIFT = 0.01


@dataclass
class DocumentFrequencies:
    """Chunks containing each lexeme, counted once and reused until the corpus has moved by
    DF_DRIFT of its chunks: a common lexeme's count reads thousands of index entries and heap
    pages on a large corpus (62 ms a query at 1M entities, docs/BENCHMARKS.md "Scale by bulk
    build", when the counts were dropped at every 30-second refresh)."""

    known: dict[str, tuple[int, int]] = field(default_factory=dict)  # lexeme -> (df, chunks then)
    chunks: int = 0  # the corpus's chunk count, set by each statistics refresh
    # How a lexeme is counted, and what that binds besides :lex (another state's chunks: as of
    # a past time, services/retrieval/as_of.py).
    statement: TextClause = field(default=_DOCUMENT_FREQUENCIES, compare=False)
    values: Mapping[str, object] = field(default_factory=dict, compare=False)

    def _fresh(self, counted_at: int) -> bool:
        return abs(self.chunks - counted_at) <= DF_DRIFT * max(self.chunks, 1)

    async def of(self, conn: AsyncConnection, lexemes: Sequence[str]) -> dict[str, int]:
        """Lexeme -> document frequency, counting only the lexemes not known or counted before
        the corpus moved by DF_DRIFT."""
        missing = sorted(
            lex
            for lex in set(lexemes)
            if lex not in self.known or not self._fresh(self.known[lex][1])
        )
        fresh: dict[str, int] = {}
        if missing:
            rows = await conn.execute(self.statement, {**self.values, "lex": missing})
            fresh = {str(lex): int(n) for lex, n in rows.all()}
            if len(self.known) + len(fresh) > MAX_CACHED_LEXEMES:
                self.known = {}  # a memory bound: start over rather than keep stale counts
            self.known.update({lex: (n, self.chunks) for lex, n in fresh.items()})
        return {
            lex: fresh[lex] if lex in fresh else self.known.get(lex, (0, 0))[0] for lex in lexemes
        }


def phrase_frequencies() -> DocumentFrequencies:
    """Document frequencies of whole phrases, cached as the lexemes' are."""
    return DocumentFrequencies(statement=PHRASE_FREQUENCIES)


@dataclass(frozen=True)
class CorpusStats:
    """Chunk count and mean full-text length (distinct lexemes) for BM25 and seed IDF, and the
    document frequencies (kept across refreshes while the corpus moves by less than
    DF_DRIFT)."""

    chunks: int
    avg_length: float
    frequencies: DocumentFrequencies = field(default_factory=DocumentFrequencies, compare=False)
    # the same for whole phrases (a seed's words, grounding.link_probability)
    phrases: DocumentFrequencies = field(default_factory=phrase_frequencies, compare=False)


@dataclass
class StatsCache:
    """Corpus statistics, recomputed at most every ``ttl_s`` (a full scan is too slow to do per
    query on a large corpus; IDF barely moves in half a minute). The document frequencies
    outlive a refresh, each recounted once the corpus has moved by DF_DRIFT."""

    ttl_s: float = 30.0
    _value: CorpusStats | None = None
    _at: float = 0.0
    _frequencies: DocumentFrequencies = field(default_factory=DocumentFrequencies)
    _phrases: DocumentFrequencies = field(default_factory=phrase_frequencies)

    async def get(self, conn: AsyncConnection) -> CorpusStats:
        """Cached statistics, refreshed through ``conn`` when stale."""
        now = time.monotonic()
        if self._value is None or now - self._at > self.ttl_s or self._value.chunks == 0:
            row = (await conn.execute(_STATS)).one()
            self._frequencies.chunks = self._phrases.chunks = int(row[0])
            self._value = CorpusStats(
                int(row[0]), max(float(row[1]), 1.0), self._frequencies, self._phrases
            )
            self._at = now
        return self._value


def idf(df: int, n: int) -> float:
    """BM25's (Robertson-Sparck Jones) inverse document frequency, floored at 0."""
    return max(0.0, math.log((n - df + 0.5) / (df + 0.5) + 1.0))


def or_query(lexemes: Sequence[str]) -> str:
    """A tsquery text matching any of the (already normalised) lexemes."""
    return " | ".join("'" + lex.replace("'", "''").replace("\\", "\\\\") + "'" for lex in lexemes)


def useful_terms(dfs: Mapping[str, int], n: int) -> dict[str, float]:
    """Lexeme -> idf for lexemes that occur somewhere but in at most half of the chunks."""
    return {lex: idf(df, n) for lex, df in dfs.items() if 0 < df <= max(1, n // 2)}


async def question_lexemes(conn: AsyncConnection, question: str) -> list[str]:
    """The question's lexemes (english configuration)."""
    return [str(r[0]) for r in (await conn.execute(_LEXEMES, {"q": question})).all()]


async def bm25_search(
    conn: AsyncConnection,
    question: str,
    k: int,
    stats: CorpusStats,
    *,
    caller: Caller,
    statement: Filtered | None = None,
    values: Mapping[str, object] | None = None,
    asked: Sequence[str] | None = None,
) -> dict[int, float]:
    """Chunk id -> BM25 score for the k best visible chunks (empty when no question term is
    indexed); ``statement`` and ``values``: another form of the scoring read (``SCORE``, as of a
    past time: services/retrieval/as_of.py) and what it binds besides; ``asked``: the
    question's lexemes when the caller has them (``question_lexemes``), else read here."""
    if asked is None:
        asked = await question_lexemes(conn, question)
    n, avglen = stats.chunks, stats.avg_length
    dfs = await stats.frequencies.of(conn, asked)
    terms = useful_terms(dfs, n)
    if not terms:
        return {}
    lexemes = sorted(terms)
    result = await conn.execute(
        *(statement or SCORE).bind(
            caller,
            {
                **(values or {}),
                "lex": lexemes,
                "idf": [terms[t] for t in lexemes],
                "query": or_query(candidate_terms({t: dfs[t] for t in terms}, MAX_CANDIDATES)),
                "k1": K1,
                "b": B,
                "avglen": avglen,
                "k": k,
            },
        )
    )
    return {int(r[0]): float(r[1]) for r in result.all()}


def candidate_terms(dfs: Mapping[str, int], cap: int) -> list[str]:
    """The rarest terms whose postings add up to at most ``cap`` chunks (at least one term):
    on a large corpus a chunk that only matches common words cannot reach the top anyway."""
    chosen: list[str] = []
    total = 0
    for term in sorted(dfs, key=lambda t: (dfs[t], t)):
        if chosen and total + dfs[term] > cap:
            break
        chosen.append(term)
        total += dfs[term]
    return chosen


def rrf(rankings: Sequence[Sequence[int]], k: int = 60) -> dict[int, float]:
    """Reciprocal rank fusion: sum over rankings of 1 / (k + rank), rank from 1."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return scores


async def question_terms(
    conn: AsyncConnection, lexemes: Sequence[str], chunks: Sequence[int]
) -> dict[int, frozenset[str]]:
    """Chunk id -> which of these (question) lexemes it contains."""
    if not chunks or not lexemes:
        return dict.fromkeys(chunks, frozenset())
    rows = await conn.execute(_SHARED_TERMS, {"lex": list(lexemes), "ids": sorted(chunks)})
    return {int(c): frozenset(terms) for c, terms in rows.all()}
