"""The query API's own request and response models (never ORM rows on the wire)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from services.retrieval.filters import Filters
from services.retrieval.plans import PlanAnswer

Mode = Literal["vector", "local", "global", "path", "graph"]
RequestMode = Literal["auto", "vector", "local", "global", "path", "graph"]
Arm = Literal["requested", "routed", "swapped"]
MAX_QUESTION_CHARS = 2000
MAX_K = 50
MAX_HOPS = 6

# [source entity, relation, target entity, evidence sentence]
Hop = tuple[str, str, str, str]
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _reject_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL (U+0000)")
    return value


def _reject_control(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters (U+0000-U+001F, U+007F)")
    return value


# PostgreSQL text cannot hold NUL; ids (Kafka keys, event ids) hold no control characters.
NoNul = AfterValidator(_reject_nul)
NoControl = AfterValidator(_reject_control)


def error_summary(exc: ValidationError) -> str:
    """The first few validation errors, one line: ``field.path: message; ...``."""
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])


class QueryRequest(BaseModel):
    """A question and how to answer it."""

    model_config = ConfigDict(extra="forbid")

    question: Annotated[str, NoNul] = Field(
        min_length=1,
        max_length=MAX_QUESTION_CHARS,
        description="The question (≤ 2000 chars, or KGSTREAM_QUERY_MAX_QUESTION_CHARS); no NUL.",
    )
    mode: RequestMode = Field(
        default="auto",
        description="auto (routed), vector (dense + BM25), local (entity graph), global "
        "(community summaries), path (paths between two named entities), graph (a count, list, "
        "ranking, comparison or impact analysis read as a typed plan: POST /v1/graph/query).",
    )
    k: int = Field(
        default=5, ge=1, le=MAX_K, description="Contexts to return (1-50, or KGSTREAM_QUERY_MAX_K)."
    )
    level: int | None = Field(
        default=None,
        ge=0,
        le=16,
        description="Community level for global mode (default: chosen by the question's breadth).",
    )
    explain: bool = Field(default=True, description="Include paths, grounding and why-notes.")
    min_snapshot: int | None = Field(
        default=None,
        ge=1,
        le=2**63 - 1,
        description="Answer from community snapshot min_snapshot or a later one (a snapshot_id "
        "from an earlier answer or a kgstream.snapshots event). The read waits up to "
        "KGSTREAM_READ_WAIT_MAX_S for its database (a replica, or the primary) to have it "
        "published; 409 otherwise.",
    )
    filters: Filters | None = Field(
        default=None,
        description="Read only the documents whose metadata and occurred_at meet these "
        "conditions, in every mode (services/retrieval/filters.py; docs/retrieval.md, "
        "Filters). They narrow what the caller may see, never widen it.",
    )
    after_event: Annotated[str, NoControl] | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Answer from a state that includes this document event (an event_id you "
        "published): the read waits up to KGSTREAM_READ_WAIT_MAX_S until the indexer has "
        "processed it and the read's database shows it; 409 otherwise (an event that was "
        "dead-lettered never arrives: see the dead letters).",
    )
    as_of: AwareDatetime | None = Field(
        default=None,
        description="Answer from the documents as they were at this time (ISO 8601 with a "
        "time zone) by their own clock, occurred_at: versions and deletes that occurred after "
        "it are not seen. Vector mode only (auto answers by vector); within the retained "
        'history (KGSTREAM_HISTORY_DAYS), 422 before it (docs/retrieval.md, "As of").',
    )

    @model_validator(mode="after")
    def _as_of_reads_passages(self) -> QueryRequest:
        if self.as_of is None:
            return self
        if self.mode not in ("auto", "vector"):
            raise ValueError(
                f"as_of answers from passages (mode vector or auto), not mode {self.mode}: "
                "the graph is kept for the current versions only"
            )
        if self.filters is not None and self.filters.held is not None:
            raise ValueError(
                "as_of cannot combine with filters.held: the fact times of replaced versions "
                "are not kept"
            )
        return self


class Context(BaseModel):
    """One retrieved passage."""

    doc_id: str
    chunk_id: int
    title: str
    text: str
    score: float
    why: str = ""


class CommunityHit(BaseModel):
    """A community summary used to answer a global question."""

    id: int
    level: int
    title: str
    summary: str
    score: float
    rating: float | None = None
    size: int = 0


class Route(BaseModel):
    """One path between two entities, hop by hop with evidence."""

    entities: list[str]
    hops: list[Hop]
    score: float


class QueryResponse(BaseModel):
    """Answer plus the contexts (and paths, communities) it came from."""

    answer: str
    support: str = Field(
        default="",
        description="Offline: the sentence the answer was read from, with its source. With an "
        "LLM: the sources the answer cites ([n] doc_id).",
    )
    abstained: bool = Field(
        default=False,
        description="The answer says the passages do not answer the question (it begins with "
        '"I don\'t know", or no passage matched): nothing retrieved answers it.',
    )
    mode_used: Mode
    snapshot_id: int | None = None
    contexts: list[Context]
    paths: list[Hop] = Field(
        default_factory=list, description="Explaining hops: [entity, relation, entity, evidence]."
    )
    routes: list[Route] = Field(default_factory=list, description="Whole paths (path mode).")
    graph: PlanAnswer | None = Field(
        default=None,
        description="Graph mode: the typed plan the question was read as, as executed, with its "
        "rows and their evidence (POST /v1/graph/query's answer).",
    )
    communities: list[CommunityHit] = Field(default_factory=list)
    grounded_entities: list[str] = Field(default_factory=list)
    timings: dict[str, float] = Field(default_factory=dict)
    tokens: dict[str, int] = Field(default_factory=dict)
    notes: list[str] = Field(
        default_factory=list, description="Routing decisions and fallbacks, in order."
    )
    query_id: str = Field(
        default="",
        description="This answer's id, for POST /v1/feedback: <arm>.<mode used>.<hex>.",
    )
    arm: Arm = Field(
        default="requested",
        description="requested: the caller named the mode; routed: the auto router's choice;"
        " swapped: the other mode, for the A/B test (KGSTREAM_QUERY_AB_SHARE).",
    )
    path_pattern: str = Field(
        default="",
        description="The retrieval's path pattern: mode, hops and relation types, e.g."
        " local:2hop, path:2hop:directed>born_in, global:L1, vector (docs/curation.md).",
    )


class FeedbackRequest(BaseModel):
    """A verdict on one answer, counted by its A/B arm and mode."""

    model_config = ConfigDict(extra="forbid")

    query_id: str = Field(min_length=1, max_length=100, description="From the query's answer.")
    useful: bool


class FeedbackResponse(BaseModel):
    """Whether this verdict was counted (a second one on the same answer is not)."""

    counted: bool
    arm: str
    mode: str


class EntitySummary(BaseModel):
    """An entity as search results list it."""

    id: int
    name: str
    type: str
    mentions: int
    score: float = 0.0
    aliases: list[str] = Field(default_factory=list)


class Neighbour(BaseModel):
    """A relationship of an entity, seen from that entity."""

    id: int
    name: str
    relation: str
    direction: Literal["out", "in"]
    weight: float
    evidence: str


class EntityDetail(EntitySummary):
    """An entity with its description and strongest neighbours."""

    description: str = ""
    neighbours: list[Neighbour] = Field(default_factory=list)


class ExploreNode(BaseModel):
    """An entity the explorer draws: hops from the entity explored (0: itself)."""

    id: int
    name: str
    type: str
    mentions: int
    hops: int


class ExploreEdge(BaseModel):
    """A relationship between two drawn entities (weak: a co-occurrence on one piece of
    evidence the caller sees)."""

    id: int
    source: int
    target: int
    type: str
    weight: float
    weak: bool


class Neighbourhood(BaseModel):
    """An entity's neighbourhood as the explorer draws it (services/retrieval/explore.py)."""

    center: ExploreNode
    nodes: list[ExploreNode] = Field(description="The drawn entities, the center first.")
    edges: list[ExploreEdge] = Field(description="Relationships among the drawn entities.")
    neighbours: int = Field(description="The center's neighbours in all, drawn or not.")
    snapshot_id: int | None = None
    notes: list[str] = Field(default_factory=list, description="What the caps cut.")


class SaidEvidence(BaseModel):
    """A sentence stating a relationship, with its document."""

    doc_id: str
    sentence: str
    strength: float


class RelationshipDetail(BaseModel):
    """One relationship and its strongest evidence sentences."""

    id: int
    source: ExploreNode
    target: ExploreNode
    type: str
    weight: float
    weak: bool
    evidence: list[SaidEvidence]


class MentionRow(BaseModel):
    """A mention of an entity: the words as said, in their sentence and document."""

    doc_id: str
    surface: str
    sentence: str


class PathsResponse(BaseModel):
    """k shortest paths between two entities."""

    source: EntitySummary
    target: EntitySummary
    snapshot_id: int | None = None
    paths: list[Route]


class FactEntity(BaseModel):
    """An entity a time-scoped fact's sentence mentions."""

    id: int
    name: str


class FactRelationship(BaseModel):
    """A relationship a time-scoped fact's sentence is evidence of."""

    id: int
    source_id: int
    source: str
    target_id: int
    target: str
    type: str


class TimedFact(BaseModel):
    """What a sentence states and when it held: days [valid_from, valid_to) (ISO dates; null
    for an open side), with the words that say so (services/core/time_spans.py)."""

    valid_from: str | None
    valid_to: str | None
    expression: str
    sentence: str
    doc_id: str
    entities: list[FactEntity]
    relationships: list[FactRelationship]


class FactsResponse(BaseModel):
    """Time-scoped facts of an entity (or of the graph) in a window, the narrowest spans
    first (the most specific to the window), then the earliest."""

    entity: EntitySummary | None = None
    facts: list[TimedFact]


class CommunitySummary(BaseModel):
    """A community of the published snapshot."""

    id: int
    level: int
    parent_id: int | None
    size: int
    title: str
    summary: str
    rating: float | None = None


class CommunitiesResponse(BaseModel):
    """Communities of one level of the published snapshot."""

    snapshot_id: int | None
    level: int | None
    communities: list[CommunitySummary]


class IngestAccepted(BaseModel):
    """Events published to the documents topic (indexing happens asynchronously)."""

    accepted: int
    event_ids: list[str]
    topic: str


class CurationRequest(BaseModel):
    """A rule about entity resolution (docs/curation.md, "Curations")."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["merge", "alias", "block", "split", "rename"]
    name: Annotated[str, NoControl] = Field(
        min_length=1, max_length=300, description="The entity the rule is about."
    )
    other: Annotated[str, NoControl] = Field(
        min_length=1,
        max_length=300,
        description="The second name: merged into ``name`` (merge), another name of it (alias),"
        " kept apart from it (block, split), or its new name (rename).",
    )
    reason: Annotated[str, NoNul] = Field(default="", max_length=2000, description="Why.")


class UndoRequest(BaseModel):
    """Why a rule is taken out of force."""

    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, NoNul] = Field(default="", max_length=2000)


class CurationOut(BaseModel):
    """A curation with its audit trail."""

    id: int
    kind: str
    name: str
    other: str | None = None
    new_name: str | None = None
    reason: str
    created_by: str = Field(description="`key:<id> (<name>)`, `cli:<user>` or `anonymous`.")
    created_at: str
    status: Literal["pending", "applied", "undoing", "undone"] = Field(
        description="pending / undoing: the indexer has not resolved the documents it touches"
        " again yet."
    )
    applied_at: str | None = None
    undone_by: str | None = None
    undone_at: str | None = None
    undo_reason: str | None = None
    undo_applied_at: str | None = None


class CurationsResponse(BaseModel):
    """Every curation, oldest first."""

    curations: list[CurationOut]
