"""Reads as of a past time (issue 31, step 4): vector mode's passages from the documents as
they were at ``as_of`` by their own clock (``occurred_at``): versions and deletes that occurred
after it are not seen. The indexer keeps what a version replaces (alembic 0025,
services/indexer/graph_store/history.py); these are the reads of vector mode (dense, BM25 and
its statistics, the passages' rows) over that state instead of the current one.

- **What a document said**: the version that held at ``as_of``: its live row when that
  version had occurred by then, else the replaced row whose span holds it; its chunks: the
  current chunks it had by then (``born_at``) and the removed ones whose span holds it.
- **Who may read it**: as now. The live row's tenant and ACL (a document shared more narrowly
  since is read under the narrower rule), or for a deleted document the last ones it had. So
  ``as_of`` never shows a caller what it may not read today, except a deleted document it
  could read until its delete, within the retention.
- **Filters** apply to the metadata and ``occurred_at`` of the version that held (the
  question is about the documents as they were). ``filters.held`` is refused: the times of
  the facts of replaced versions are not kept.
- **BM25 statistics** (chunk count, mean length, document frequencies) are those of the state
  as of then, counted per query (no cache), so a ranking equals the one an index built from
  the events up to ``as_of`` gives (tests/integration/test_as_of.py).
- **Where it stops**: before ``history_horizon.kept_since`` (when history began being kept,
  moved forward by pruning after KGSTREAM_HISTORY_DAYS) it is refused; the graph modes
  (local, global, path) answer from the current graph only, so ``as_of`` is refused there.
- **Cost**: the dense read follows the HNSW index over the current chunks (scanning on until
  k pass the past state's filter) and scores the removed chunks that held then exhaustively;
  the BM25 statistics are counted per query (docs/BENCHMARKS.md, "As of": 3-5x a query now)."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.errors import KgstreamError
from services.retrieval.lexical import (
    FREQUENCIES_SQL,
    PHRASE_FREQUENCIES_SQL,
    SCORE_SQL,
    SCORE_VISIBLE_SQL,
    STATS_SQL,
    CorpusStats,
    DocumentFrequencies,
)
from services.retrieval.vector import CHUNKS_SQL, CHUNKS_VISIBLE_SQL, PassageReads
from services.retrieval.visibility import DOC_VISIBLE, Filtered

# A current chunk existed at :as_of when the version that brought it in had occurred; a row of
# history (a removed chunk, a replaced documents row) when its span holds :as_of.
_BORN = "c.born_at <= CAST(:as_of AS timestamptz)"


def _held(row: str) -> str:
    return (
        f"{row}.valid_from <= CAST(:as_of AS timestamptz)"
        f" AND CAST(:as_of AS timestamptz) < {row}.valid_to"
    )


def _documents_at(document: str = "") -> str:
    """Each document as it was at :as_of, shaped as ``documents`` (the visibility and filter
    predicates read it unchanged), its tenant and ACL as now (see the module's rules); only
    ``document`` (an SQL expression of its doc_id) when given, read by its keys."""
    live = f" AND d.doc_id = {document}" if document else ""
    kept = f" AND v.doc_id = {document}" if document else ""
    return (
        "SELECT d.doc_id, d.tenant, d.title, d.acl, d.metadata, d.occurred_at FROM documents d"  # noqa: S608 - constants
        f" WHERE NOT d.deleted AND d.occurred_at <= CAST(:as_of AS timestamptz){live}"
        " UNION ALL"
        " SELECT v.doc_id, rule.tenant, v.title, rule.acl, v.metadata, v.valid_from"
        " FROM document_versions v CROSS JOIN LATERAL (SELECT r.tenant, r.acl FROM ("
        "  SELECT 0 AS o, cur.tenant, cur.acl FROM documents cur"
        "   WHERE cur.doc_id = v.doc_id AND NOT cur.deleted"
        "  UNION ALL (SELECT 1, l.tenant, l.acl FROM document_versions l"
        "   WHERE l.doc_id = v.doc_id ORDER BY l.valid_to DESC, l.id DESC LIMIT 1))"
        "  r ORDER BY r.o LIMIT 1) rule"
        f" WHERE {_held('v')}{kept}"
    )


_CHUNKS_AT = (
    "chunks_at AS ("  # noqa: S608 - constants
    f" SELECT c.id, c.doc_id, c.text, c.embedding, c.tsv FROM chunks c WHERE {_BORN}"
    " UNION ALL"
    " SELECT c.id, c.doc_id, c.text, c.embedding, c.tsv FROM chunk_history c"
    f" WHERE {_held('c')})"
)
# A passage's document, probed by its key per candidate (so the dense read can follow the
# HNSW order and stop at k); the documents as a whole where a read lists them.
_TABLES = (
    (re.compile(r"\bchunks c\b"), "chunks_at c"),
    (re.compile(r"\bFROM documents d\b"), "FROM documents_at d"),
    (
        re.compile(r"\bJOIN documents d USING \(doc_id\)"),
        f"CROSS JOIN LATERAL ({_documents_at('c.doc_id')}) d",
    ),
)


def at_time(sql: str) -> str:
    """A read of ``chunks c`` and ``documents d`` made a read of the state as of ``:as_of``."""
    for table, past in _TABLES:
        sql = table.sub(past, sql)
    with_tables = f"WITH documents_at AS ({_documents_at()}), {_CHUNKS_AT}"
    return f"{with_tables}, {sql[5:]}" if sql.startswith("WITH ") else f"{with_tables} {sql}"


def _nearest(visible: bool) -> str:
    """The dense read as of :as_of: the current chunks it had (the HNSW index, scanned until
    k pass) and the removed ones that held then (scored exhaustively: a past state has no
    index), each side's k nearest, then the k nearest of both."""
    where = f" AND {DOC_VISIBLE}" if visible else ""
    document = f"CROSS JOIN LATERAL ({_documents_at('c.doc_id')}) d"
    side = (
        "(SELECT c.id, c.doc_id, d.title, c.text, c.embedding <=> CAST(:q AS vector) AS dist"  # noqa: S608 - constants
        " FROM {table} c " + document + " WHERE {held}" + where + " ORDER BY dist LIMIT :k)"
    )
    current = side.format(table="chunks", held=_BORN)
    removed = side.format(table="chunk_history", held=_held("c"))
    return (
        f"SELECT n.id, n.doc_id, n.title, n.text, 1 - n.dist FROM ({current} UNION ALL"  # noqa: S608 - constants
        f" {removed}) n ORDER BY n.dist, n.id LIMIT :k"
    )


_READS = (
    Filtered.of(_nearest(visible=False), _nearest(visible=True)),
    Filtered.of(at_time(SCORE_SQL), at_time(SCORE_VISIBLE_SQL)),
    Filtered.of(at_time(CHUNKS_SQL), at_time(CHUNKS_VISIBLE_SQL)),
)
_STATS = text(at_time(STATS_SQL))
_FREQUENCIES = text(at_time(FREQUENCIES_SQL))
_PHRASES = text(at_time(PHRASE_FREQUENCIES_SQL))
# Whether history reaches back to :as_of, and from when it is kept (NULL: none, or always).
_HORIZON = text(
    "SELECT coalesce(kept_since <= CAST(:as_of AS timestamptz), false),"
    " CASE WHEN isfinite(kept_since) THEN kept_since END FROM history_horizon"
)


class HistoryNotKept(KgstreamError):
    """``as_of`` is earlier than the history this database keeps (or none is kept)."""

    def __init__(self, as_of: datetime, kept_since: datetime | None) -> None:
        since = (
            "no history is kept (KGSTREAM_HISTORY_DAYS=0)"
            if kept_since is None
            else f"history is kept from {kept_since.isoformat()} (KGSTREAM_HISTORY_DAYS)"
        )
        super().__init__(f"as_of {as_of.isoformat()} is out of reach: {since}")
        self.kept_since = kept_since


def as_of_caller(caller: Caller) -> Caller:
    """The caller for a past state: whole-corpus was decided over the live documents now, so
    a restricted caller's reads state visibility row by row again."""
    return replace(caller, whole_corpus=False)


async def past_reads(conn: AsyncConnection, as_of: datetime) -> tuple[PassageReads, CorpusStats]:
    """Vector mode's reads as of ``as_of`` and the BM25 statistics of that state (document
    frequencies counted in it as BM25 asks for them); raises HistoryNotKept when the history
    does not reach back to it."""
    values = {"as_of": as_of}
    reaches, kept_since = (await conn.execute(_HORIZON, values)).one()
    if not reaches:
        raise HistoryNotKept(as_of, kept_since)
    chunks, avg_length = (await conn.execute(_STATS, values)).one()
    frequencies = DocumentFrequencies(chunks=int(chunks), statement=_FREQUENCIES, values=values)
    phrases = DocumentFrequencies(chunks=int(chunks), statement=_PHRASES, values=values)
    stats = CorpusStats(int(chunks), max(float(avg_length), 1.0), frequencies, phrases)
    nearest, bm25, load = _READS
    return PassageReads(nearest, bm25, load, values, filtered=True), stats
