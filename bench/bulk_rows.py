"""The rows the indexer would write for bench/synth_corpus.py's documents, computed without
the models: the generator knows every name it put in a sentence, so NER is a lookup and the
default extractor's co-occurrence relations follow from the sentences.

What is the indexer's own code here: the chunker (services/core/chunking.py with the settings'
size and overlap), the document text and chunk dedupe (services/indexer/compute.py), the hashes
(services/indexer/ordering.py), the title mention (resolution.with_title), the document's
surfaces and short forms (resolution.local_canonical, document_surfaces), the type groups and
their compatibility, entity keys (services/core/normalize.py), the relation kind and strength
(services/core/extraction.py: co_occurs, 0.3, one per pair of names in a sentence). What is
re-stated here (graph_store.rebuild computes it in SQL per event; here once per entity or
relationship, in Python, with the same rule): mention_count, type (the mode of the mentions'
types, ties to the smallest), name (the surface with a space, then the most frequent, then the
smallest), description (the first 5 distinct (doc_id, sentence) in that order, joined, 1,500
characters), a relationship's weight (the sum of its evidence strengths), evidence_count and
description (every evidence sentence by (doc_id, sentence), 2,000 characters), graph_changes
(per event: node add / change, edge add / change, each sorted by id).

Simplified, on purpose:
- NER is exact: every generated name is found with the type of its kind (person PERSON, place
  GPE, org ORG). spaCy finds ~99% of them exactly and types some differently (BENCHMARKS).
- Sentences are the generator's (split at ". "); spaCy's sentence recognizer may split or join
  a few differently, and a chunk cut inside a sentence gives the part inside the chunk.
- No cross-document fuzzy merges (trigram candidates confirmed by name embeddings): generated
  names are distinct by construction, so the exact key (and the type group) decides, as the
  indexer's first resolution step does.
- Embeddings are a seeded random projection of hashed word tokens (``HashedEmbedder``), of the
  configured dimension, normalised: the latency of pgvector's HNSW depends on the dimension and
  the row count, not on meaning, so **retrieval-quality figures from a bulk-built database mean
  nothing**.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from services.core.chunking import Chunker
from services.core.contracts import DocumentEvent
from services.core.extraction import CO_OCCURS, CO_OCCURS_STRENGTH, ExtractedEntity, Extraction
from services.core.normalize import entity_key
from services.indexer import resolution
from services.indexer.compute import _dedupe_chunks, document_text
from services.indexer.ordering import content_hash
from services.indexer.resolution import (
    WILDCARD,
    compatible,
    document_surfaces,
    local_canonical,
    with_title,
)

# spaCy's labels for the generator's kinds (what en_core_web_sm tags them, BENCHMARKS).
NER_TYPE = {"person": "PERSON", "place": "GPE", "org": "ORG"}
# graph_store.rebuild's string_agg limits.
ENTITY_DESCRIPTION_CHARS = 1500
ENTITY_DESCRIPTION_SENTENCES = 5
RELATIONSHIP_DESCRIPTION_CHARS = 2000
KEY_CACHE = 1 << 21  # names memoised: above the 1.5M-name universe of a 1M-entity corpus
# The generator ends every sentence with "." and joins them with one space; no name or
# template holds ". " inside a sentence.
_SENTENCE_END = re.compile(r"(?<=\.) ")
_WORD = re.compile(r"\w+")

Vector = npt.NDArray[np.float32]


class HashedEmbedder:
    """A seeded, cheap embedding: every lower-cased word token gets a fixed random direction
    (normal entries, seeded by the seed and the token's hash), a text is the sum of its
    tokens' directions, normalised to unit length. Texts sharing words are close, as with a
    model; nothing else about meaning holds."""

    def __init__(self, dim: int, seed: int) -> None:
        if dim < 1:
            raise ValueError(f"embedding dimension must be >= 1, not {dim}")
        self.dim, self.seed = dim, seed
        self._index: dict[str, int] = {}
        self._matrix = np.zeros((1024, dim), dtype=np.float32)

    def _row(self, token: str) -> int:
        at = self._index.get(token)
        if at is None:
            at = len(self._index)
            if at == len(self._matrix):
                self._matrix = np.concatenate([self._matrix, np.zeros_like(self._matrix)])
            digest = hashlib.blake2b(f"{self.seed}:{token}".encode(), digest_size=8).digest()
            rng = np.random.default_rng(int.from_bytes(digest, "little"))
            self._matrix[at] = rng.standard_normal(self.dim, dtype=np.float32)
            self._index[token] = at
        return at

    model_id = "hashed-projection"  # the Embedder protocol's fields (services/core/embedding.py)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """The Embedder protocol: one vector per text, as lists."""
        return [self.vector(t).tolist() for t in texts]

    def vector(self, text: str) -> Vector:
        """The unit vector of ``text`` (a fixed unit vector for a text without words)."""
        rows = [self._row(t) for t in _WORD.findall(text.lower())] or [self._row("")]
        vec = self._matrix[rows].sum(axis=0)
        norm = float(np.linalg.norm(vec))
        out: Vector = (vec / norm if norm else vec).astype(np.float32)
        return out


@dataclass(slots=True)
class EntityState:
    """One entity as the database holds it after every document: what rebuild() aggregates.
    Its name embedding (of the name that created it) is computed when the row is written."""

    id: int
    key: str
    group: str
    first_name: str
    tenant: str | None = None  # its documents' (services/indexer/scope.py)
    types: Counter[str] = field(default_factory=Counter)
    surfaces: Counter[str] = field(default_factory=Counter)
    sentences: list[tuple[str, str]] = field(default_factory=list)  # the smallest 5 so far

    @property
    def mention_count(self) -> int:
        return sum(self.types.values())

    def row_type(self) -> str:
        """mode() WITHIN GROUP (ORDER BY type): the most frequent, ties to the smallest."""
        return min(self.types.items(), key=lambda kv: (-kv[1], kv[0]))[0]

    def row_name(self) -> str:
        """The surface with a space first, then the most frequent, then the smallest."""
        items = self.surfaces.items()
        return min(items, key=lambda kv: (" " not in kv[0], -kv[1], kv[0]))[0]

    def description(self) -> str:
        return " ".join(s for _, s in self.sentences)[:ENTITY_DESCRIPTION_CHARS]


@dataclass(slots=True)
class RelationshipState:
    """One relationship row: its evidence count, weight and description so far."""

    id: int
    source_id: int
    target_id: int
    type: str
    weight: float = 0.0
    evidence_count: int = 0
    description: str = ""


@dataclass(frozen=True)
class DocumentRows:
    """The streamed rows of one event (entities and relationships are written at the end)."""

    document: tuple[Any, ...]
    processed: tuple[Any, ...]
    chunks: list[tuple[Any, ...]]
    mentions: list[tuple[Any, ...]]
    aliases: list[tuple[Any, ...]]
    evidence: list[tuple[Any, ...]]
    changes: list[tuple[Any, ...]]


@dataclass
class _Sentence:
    start: int  # in the document text
    end: int
    names: list[tuple[int, int, str]]  # (start, end, name) in the document text


class GraphRows:
    """Feeds events in order and returns each one's rows; ``entities()`` and
    ``relationships()`` give the final aggregate rows after the last event."""

    def __init__(
        self, kinds: dict[str, str], embedder: HashedEmbedder, chunker: Chunker, now: datetime
    ) -> None:
        self.kinds = kinds  # generated name -> kind
        self.embedder, self.chunker, self.now = embedder, chunker, now
        self._entities: list[EntityState] = []
        # (tenant, key) -> entities: resolution is per tenant (services/indexer/scope.py)
        self._by_key: dict[tuple[str | None, str], list[EntityState]] = {}
        self._relationships: dict[tuple[int, int, str], RelationshipState] = {}
        self._rel_sentences: dict[int, list[tuple[str, str]]] = {}
        self._aliases: set[tuple[int, str]] = set()
        self._ids = Counter[str]()  # table -> last id given
        # entity_key is pure and called ~50 times a document on ~10 names: memoised while
        # this builder runs (resolution's own calls included, see add()).
        self._key = functools.lru_cache(maxsize=KEY_CACHE)(entity_key)

    def _next(self, table: str) -> int:
        self._ids[table] += 1
        return self._ids[table]

    def add(self, raw: dict[str, Any]) -> DocumentRows:
        """The rows one upsert event writes into an empty or growing graph."""
        original = getattr(resolution, "entity_key")  # noqa: B009 - swapped and restored
        setattr(resolution, "entity_key", self._key)  # noqa: B010 - restored below
        try:
            return self._add(raw)
        finally:
            setattr(resolution, "entity_key", original)  # noqa: B010

    def _add(self, raw: dict[str, Any]) -> DocumentRows:
        event = DocumentEvent.model_validate(raw)
        text = document_text(event)
        sentences = self._sentences(event, text)
        planned = _dedupe_chunks(event.title, self.chunker.split(text))
        chunk_rows: list[tuple[Any, ...]] = []
        per_chunk: list[tuple[int, list[ExtractedEntity], list[tuple[str, str, str]]]] = []
        for diff_hash, chunk in planned:
            chunk_id = self._next("chunks")
            embed_input = chunk.text if chunk.ord == 0 else f"{event.title}\n{chunk.text}"
            chunk_rows.append(
                (
                    chunk_id,
                    event.doc_id,
                    chunk.ord,
                    diff_hash,
                    chunk.text,
                    chunk.token_count,
                    chunk.start_char,
                    chunk.end_char,
                    self.embedder.vector(embed_input),
                )
            )
            found, pairs = _extract(sentences, text, chunk.start_char, chunk.end_char, self.kinds)
            entities = with_title(event.title, _as_extraction(found)).entities
            per_chunk.append((chunk_id, entities, pairs))
        mentioned = [e for _, ents, _ in per_chunk for e in ents]
        # local_canonical reads only which (name, type) pairs occur: one of each is enough.
        canonical = local_canonical(list({(e.name, e.type): e for e in mentioned}.values()))
        surfaces = document_surfaces(mentioned, canonical)
        ids, added = self._resolve(surfaces, event.tenant)

        def entity_of(name: str) -> EntityState | None:
            own = self._key(name)
            return ids.get(canonical.get(own, own))

        # ON CONFLICT (chunk_id, entity_id, start_char) DO NOTHING: the first one stays.
        mentions: dict[tuple[int, int, int], tuple[Any, ...]] = {}
        for chunk_id, ents, _ in per_chunk:
            for ent in ents:
                state = entity_of(ent.name)
                if state is not None:
                    row = (state.id, chunk_id, event.doc_id, ent.name, ent.type, ent.start,
                           ent.end, ent.sentence)  # fmt: skip
                    mentions.setdefault((state.id, chunk_id, ent.start), row)
        mention_rows = [mentions[k] for k in sorted(mentions)]
        touched = self._aggregate_mentions(event.doc_id, mention_rows)
        alias_rows = []
        for row in mention_rows:
            if (row[0], row[3]) not in self._aliases:
                self._aliases.add((row[0], row[3]))
                alias_rows.append((row[0], row[3], self._key(row[3])))
        evidence, rels_added, rels_touched = self._evidence(event.doc_id, per_chunk, entity_of)
        mention_ids = [(self._next("mentions"), *r) for r in mention_rows]
        changes = [
            (self._next("graph_changes"), kind, ref, op, event.doc_id, event.event_id, self.now)
            for kind, op, refs in (
                ("node", "add", added),
                ("node", "change", touched - added),
                ("edge", "add", rels_added),
                ("edge", "change", rels_touched - rels_added),
            )
            for ref in sorted(refs)
        ]
        document = (
            event.doc_id, event.tenant, event.title, event.version,
            content_hash(event.title, event.text), event.metadata, event.acl, event.occurred_at,
            False, event.event_id, self.now, self.now,
        )  # fmt: skip
        processed = (event.event_id, event.doc_id, "applied", self.now, event.occurred_at, self.now)
        return DocumentRows(
            document, processed, chunk_rows, mention_ids, alias_rows, evidence, changes
        )

    def _sentences(self, event: DocumentEvent, text: str) -> list[_Sentence]:
        """The title line and the generator's sentences, with the names each holds."""
        names = sorted(event.metadata.get("names", []), key=lambda n: (-len(n), n))
        if event.title and event.title not in names:
            names.append(event.title)
        if not names:
            raise ValueError(f"{event.doc_id}: no metadata.names (not a synth_corpus event?)")
        spans: list[tuple[int, int]] = []
        at = 0
        if event.title:
            spans.append((0, len(event.title)))
            at = len(event.title) + 2  # document_text's blank line
        for part in _SENTENCE_END.split(text[at:]):
            spans.append((at, at + len(part)))
            at += len(part) + 1
        return [_Sentence(s, e, _find_names(text, s, e, names)) for s, e in spans]

    def _resolve(
        self, surfaces: dict[str, Any], tenant: str | None
    ) -> tuple[dict[str, EntityState], set[int]]:
        """resolution._exact's rule on the stored entities (same group over a wildcard, then
        the better evidenced, then the oldest); a new entity for every key nothing fits."""
        ids: dict[str, EntityState] = {}
        added: set[int] = set()
        for key in sorted(surfaces):
            surface = surfaces[key]
            stored = self._by_key.setdefault((tenant, key), [])
            fits = [e for e in stored if compatible(e.group, surface.group)]
            if fits:
                best = min(fits, key=lambda e: (e.group != surface.group, -e.mention_count, e.id))
                if (
                    best.group == WILDCARD
                    and surface.group != WILDCARD
                    and not any(e.group == surface.group for e in stored)
                ):
                    best.group = surface.group
                ids[key] = best
                continue
            state = EntityState(self._next("entities"), key, surface.group, surface.name, tenant)
            self._entities.append(state)
            stored.append(state)
            ids[key] = state
            added.add(state.id)
        return ids, added

    def _aggregate_mentions(self, doc_id: str, rows: Sequence[tuple[Any, ...]]) -> set[int]:
        by_id = {}
        for entity_id, _, _, surface, kind, _, _, sentence in rows:
            state = self._entities[entity_id - 1]
            by_id[entity_id] = state
            state.types[kind] += 1
            state.surfaces[surface] += 1
            if len(state.sentences) < ENTITY_DESCRIPTION_SENTENCES or (
                state.sentences[-1][0] == doc_id
            ):  # later documents sort after every earlier one (zero-padded ids)
                pair = (doc_id, sentence)
                if pair not in state.sentences:
                    state.sentences.append(pair)
        for state in by_id.values():
            state.sentences = sorted(state.sentences)[:ENTITY_DESCRIPTION_SENTENCES]
        return set(by_id)

    def _evidence(
        self,
        doc_id: str,
        per_chunk: Sequence[tuple[int, list[ExtractedEntity], list[tuple[str, str, str]]]],
        entity_of: Any,
    ) -> tuple[list[tuple[Any, ...]], set[int], set[int]]:
        """graph_store.add_relationships' edges: per (relationship, chunk) one evidence row."""
        edge_rows: dict[tuple[int, int, str], dict[int, str]] = {}
        for chunk_id, _, pairs in per_chunk:
            for a, b, sentence in pairs:
                s, t = entity_of(a), entity_of(b)
                if s is None or t is None or s.id == t.id:
                    continue
                lo, hi = sorted((s.id, t.id))  # co_occurs is undirected: one row per pair
                edge_rows.setdefault((lo, hi, CO_OCCURS), {}).setdefault(chunk_id, sentence)
        added: set[int] = set()
        rows: list[tuple[Any, ...]] = []
        for edge in sorted(edge_rows):
            rel = self._relationships.get(edge)
            if rel is None:
                rel = RelationshipState(self._next("relationships"), *edge)
                self._relationships[edge] = rel
                added.add(rel.id)
            for chunk_id, sentence in edge_rows[edge].items():
                rows.append((rel.id, chunk_id, doc_id, CO_OCCURS_STRENGTH, sentence))
                rel.weight += CO_OCCURS_STRENGTH
                rel.evidence_count += 1
            if len(rel.description) < RELATIONSHIP_DESCRIPTION_CHARS:
                # documents arrive in doc_id order, so earlier ones are already in place
                mine = sorted(edge_rows[edge].values())
                rel.description = " ".join([rel.description, *mine] if rel.description else mine)
                rel.description = rel.description[:RELATIONSHIP_DESCRIPTION_CHARS]
        rows.sort()
        evidence = [(self._next("relationship_evidence"), *r) for r in rows]
        return evidence, added, {r[0] for r in rows}

    def entities(self) -> Iterator[tuple[Any, ...]]:
        """Final entity rows: (id, key, name, type, description, mention_count, embedding,
        created_at, updated_at, type_group, tenant); entities without mentions are not kept."""
        for e in self._entities:
            if e.mention_count:
                yield (
                    e.id, e.key, e.row_name(), e.row_type(), e.description(), e.mention_count,
                    self.embedder.vector(e.first_name), self.now, self.now, e.group, e.tenant,
                )  # fmt: skip

    def relationships(self) -> Iterator[tuple[Any, ...]]:
        """Final relationship rows: (id, source_id, target_id, type, weight, evidence_count,
        description)."""
        for r in sorted(self._relationships.values(), key=lambda r: r.id):
            yield (
                r.id, r.source_id, r.target_id, r.type, r.weight, r.evidence_count, r.description
            )  # fmt: skip

    @property
    def counts(self) -> dict[str, int]:
        """Rows given so far per table (by the ids handed out)."""
        return dict(self._ids)


def _as_extraction(found: Iterable[ExtractedEntity]) -> Extraction:
    return Extraction(entities=list(found), relations=[])


def _find_names(
    text: str, start: int, end: int, names: Sequence[str]
) -> list[tuple[int, int, str]]:
    """Where ``names`` (longest first) occur in text[start:end] as whole words, none inside a
    longer one found first ("Marton" inside "Lake Marton" is not a mention of Marton)."""
    found: list[tuple[int, int, str]] = []
    for name in names:
        at = text.find(name, start, end)
        while at >= 0:
            stop = at + len(name)
            whole = (at == 0 or not text[at - 1].isalnum()) and (
                stop == len(text) or not text[stop].isalnum()
            )
            if whole and not any(s < stop and at < e for s, e, _ in found):
                found.append((at, stop, name))
            at = text.find(name, at + 1, end)
    return sorted(found)


def _extract(
    sentences: Sequence[_Sentence], text: str, start: int, end: int, kinds: dict[str, str]
) -> tuple[list[ExtractedEntity], list[tuple[str, str, str]]]:
    """What the co-occurrence extractor gives for the chunk text[start:end]: every name inside
    it (offsets in the chunk) with the part of its sentence inside the chunk, and one relation
    per pair of distinct names in a sentence (names sorted, the first sentence kept)."""
    entities: list[ExtractedEntity] = []
    pairs: dict[tuple[str, str], str] = {}
    for sent in sentences:
        if sent.end <= start or sent.start >= end:
            continue
        sentence = text[max(sent.start, start) : min(sent.end, end)].strip()
        inside = [(s, e, n) for s, e, n in sent.names if s >= start and e <= end]
        for s, e, name in inside:
            kind = NER_TYPE[kinds[name]]
            entities.append(ExtractedEntity(name, kind, s - start, e - start, sentence))
        distinct = sorted({n for _, _, n in inside})
        for i, a in enumerate(distinct):
            for b in distinct[i + 1 :]:
                pairs.setdefault((a, b), sentence)
    return entities, [(a, b, s) for (a, b), s in pairs.items()]
