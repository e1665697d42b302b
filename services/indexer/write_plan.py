"""One event's write, decided by the compute phase: everything the transaction writes that can
be known before it starts. Immutable; built once per upsert by ``build_write_plan`` and written by
services/indexer/graph_store/, which derives nothing from the extraction again: what it still
reads is what only the database knows at commit time (entity ids, which names exist now, the
merge candidates other writers may have created since, the rows to lock).

A plan holds while the document's stored chunks are as it saw them: the chunks it keeps must
still be there, the ones it adds must still be missing (``WritePlan.holds_for``). When they
moved (another event for the document landed in between), the write raises StaleComputeError
and the event is computed again. A plan that moves the document to another tenant (``moved``:
every chunk replaced, resolved in the new tenant's scope) holds while the stored document is
still another tenant's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from services.core.chunking import Chunk
from services.core.contracts import DocumentEvent
from services.core.curation_rules import NO_RULES, CurationRules
from services.core.extraction import ExtractedEntity, ExtractedRelation, Extraction, StatedTime
from services.core.normalize import entity_key
from services.indexer.provided import (
    EXTRACTED,
    PUBLISHER,
    provided_aliases,
    provided_mentions,
    provided_relations,
)
from services.indexer.resolution import (
    Decisions,
    ResolverConfig,
    Surface,
    document_surfaces,
    local_canonical,
    with_title,
)


@dataclass(frozen=True)
class UpsertPlan:
    """What an upsert would change, decided before the transaction (and checked again in it):
    every chunk of the new version by diff hash, and the ones the database lacks."""

    event: DocumentEvent
    doc_hash: str
    planned: list[tuple[str, Chunk]]  # every chunk of the new version: (diff hash, chunk)
    fresh: list[tuple[str, Chunk]]  # the ones the database lacks: to embed and extract
    duplicate: bool = False
    # The document changes tenant: every stored chunk goes, every chunk is fresh.
    moved: bool = False


@dataclass(frozen=True)
class NewChunk:
    """A chunk the database does not have yet, with its embedding."""

    ord: int
    diff_hash: str
    text: str
    token_count: int
    start_char: int
    end_char: int
    embedding: Sequence[float]


@dataclass(frozen=True)
class MentionRow:
    """One mention of a new chunk: ``key`` is the surface key it resolves by (after the
    document's short forms), ``alias_key`` the key of its own surface (the alias it adds)."""

    chunk: str  # diff hash of its chunk
    key: str
    surface: str
    type: str
    start: int
    end: int
    sentence: str
    alias_key: str
    origin: str = EXTRACTED


@dataclass(frozen=True)
class TokenTotal:
    """Extraction tokens one model spent on the new chunks (LLM extractors only)."""

    model: str
    prompt: int
    completion: int


@dataclass(frozen=True)
class WritePlan:
    """An upsert as the transaction writes it (see the module docstring)."""

    event: DocumentEvent
    doc_hash: str
    duplicate: bool
    kept: Sequence[tuple[str, Chunk]]  # chunks the database has: (diff hash, chunk), moved
    new: Sequence[NewChunk]
    # Entity resolution: surfaces by key, the document's short forms (surface key -> key of
    # the longer name), embeddings of names the database did not know (as pgvector text), the
    # thresholds, and the
    # adjudicator's answers for the ambiguous candidates seen by the compute phase.
    surfaces: Mapping[str, Surface]
    canonical: Mapping[str, str]
    name_vectors: Mapping[str, str]
    resolver: ResolverConfig
    mentions: Sequence[MentionRow]
    # (diff hash of its chunk, the relation with its ends as surface keys)
    relations: Sequence[tuple[str, ExtractedRelation]]
    # The same for the publisher's relationships (services/indexer/provided.py)
    provided_relations: Sequence[tuple[str, ExtractedRelation]]
    tokens: Sequence[TokenTotal]
    decisions: Decisions = field(default_factory=dict)
    # The curations it was resolved under: the transaction checks they are still in force.
    rules: CurationRules = NO_RULES
    # Set by a curation's apply: the names its rules are about. Aliases and entities of those
    # names that only documents it still has to do support do not count
    # (services/indexer/curation_apply.py).
    ruled_keys: frozenset[str] = frozenset()
    # The document changes tenant (``UpsertPlan.moved``).
    moved: bool = False
    # When the facts of a sentence held: (diff hash of its chunk, the time), once each.
    times: Sequence[tuple[str, StatedTime]] = ()

    def holds_for(self, stored: Mapping[str, int], *, moved: bool) -> bool:
        """True when the document's stored chunks (diff hash -> id) are as the plan saw them,
        and it changes tenant (``moved``, decided again under the document's lock) as the
        plan saw it. A plan that moves the document replaces whatever chunks it has."""
        if moved != self.moved:
            return False
        return moved or (
            all(h in stored for h, _ in self.kept)
            and not any(c.diff_hash in stored for c in self.new)
        )


def build_write_plan(
    diff: UpsertPlan,
    computed: Mapping[str, tuple[Sequence[float], Extraction]],
    *,
    kept_mentions: Sequence[ExtractedEntity],
    resolver: ResolverConfig,
    rules: CurationRules = NO_RULES,
) -> WritePlan:
    """The plan of ``diff`` given its fresh chunks' embeddings and extractions (by diff hash)
    and the mentions of the chunks it keeps. Names to embed and the adjudicator's answers
    depend on the whole batch and the database: the compute phase adds them
    (``name_vectors``, ``decisions``)."""
    fresh = {h for h, _ in diff.fresh}
    title = diff.event.title
    # Short forms resolve against the whole document, kept chunks included, exactly as a
    # rebuild from scratch would see it.
    entities_of = {h: with_title(title, computed[h][1]).entities for h in fresh}
    given = provided_mentions(diff.event)
    whole = [*(e for h, _ in diff.fresh for e in entities_of[h]), *kept_mentions, *given]
    local = provided_aliases(diff.event, local_canonical(whole))
    canonical, forced = rules.canonical(local, {entity_key(e.name) for e in whole})
    new: list[NewChunk] = []
    mentions: list[MentionRow] = []
    relations: list[tuple[str, ExtractedRelation]] = []
    mentioned: list[ExtractedEntity] = []
    tokens: dict[str, tuple[int, int]] = {}
    times: dict[tuple[str, StatedTime], None] = {}

    def resolved(name: str) -> str:
        own = entity_key(name)
        return canonical.get(own, own)

    for h, c in diff.fresh:
        embedding, extraction = computed[h]
        new.append(NewChunk(c.ord, h, c.text, c.token_count, c.start_char, c.end_char, embedding))
        entities = entities_of[h]
        mentioned += entities
        mentions += [
            MentionRow(
                h, resolved(e.name), e.name, e.type, e.start, e.end, e.sentence, entity_key(e.name)
            )
            for e in entities
        ]
        relations += [
            (h, replace(r, source=resolved(r.source), target=resolved(r.target)))
            for r in extraction.relations
        ]
        times.update(dict.fromkeys((h, t) for t in extraction.times))
        if extraction.usage is not None:
            u = extraction.usage
            prompt, completion = tokens.get(u.model, (0, 0))
            tokens[u.model] = (prompt + u.prompt_tokens, completion + u.completion_tokens)
    # The publisher's facts live on the first chunk, and with it: written when it is new.
    anchor = diff.planned[0][0] if diff.planned else None
    given_relations: list[tuple[str, ExtractedRelation]] = []
    if anchor in fresh and given:
        mentioned += given
        mentions += [
            MentionRow(
                anchor,
                resolved(e.name),
                e.name,
                e.type,
                e.start,
                e.end,
                e.sentence,
                entity_key(e.name),
                PUBLISHER,
            )
            for e in given
        ]
        given_relations = [
            (anchor, replace(r, source=resolved(r.source), target=resolved(r.target)))
            for r in provided_relations(diff.event)
        ]
    return WritePlan(
        event=diff.event,
        doc_hash=diff.doc_hash,
        duplicate=diff.duplicate,
        kept=[(h, c) for h, c in diff.planned if h not in fresh],
        new=new,
        surfaces=document_surfaces(mentioned, canonical, forced),
        canonical=canonical,
        name_vectors={},
        resolver=resolver,
        mentions=mentions,
        relations=relations,
        provided_relations=given_relations,
        tokens=[TokenTotal(m, p, c) for m, (p, c) in sorted(tokens.items())],
        rules=rules,
        moved=diff.moved,
        times=list(times),
    )
