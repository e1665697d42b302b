"""Typed graph plans (issue 33): the questions passages cannot answer (how many, which ones,
what follows from X, how do A and B compare, which are not related to X) stated as a plan over
the graph, validated and bounded here, executed by services/retrieval/plan_exec.py as
statements this project writes. No query text from a caller or a model is ever executed: a
plan names entities, types and relationship types, which are bound as values.

A plan, in order:
1. ``start``: entities by name (exact name or alias, as the resolver keys them) and/or by type;
2. ``follow``: steps along relationships (types, direction), each repeated up to its ``depth``
   (every entity reached within it counts: three hops downstream is an impact analysis), the
   next step from all the last one arrived at; the depths add up to at most MAX_DEPTH. The
   entities the last step arrives at, first reached there, are the plan's (the start entities
   when there is no step);
3. ``where``: the reached entities of these types only;
4. ``exclude``: minus the entities one step from the named ones (negation: "not supplied by X");
5. ``result``: count, list (paged), group (by type, or by the entity each is related to through
   a relationship type), rank (by relationship degree, mentions or the snapshot's PageRank), or
   compare (two named entities side by side: facts and neighbours, shared and not).

The JSON Schema of a plan is schemas/graph_plan.v1.json, generated from these models
(``plan_json_schema``; a unit test keeps the file equal to it)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PLAN_SCHEMA_VERSION = 1
MAX_DEPTH = 3  # the bound: impact analysis three hops downstream
MAX_NAMES = 20  # entities a plan may name in one place
MAX_TYPES = 20  # types a plan may list in one place
MAX_STEPS = 3  # follow steps (each at least one hop, so MAX_DEPTH bounds them too)
MAX_PAGE = 200  # rows a list or rank returns at once
NAME_CHARS = 200  # a name is a name, not a document
TYPE_CHARS = 64

Direction = Literal["out", "in", "both"]
Name = Annotated[str, Field(min_length=1, max_length=NAME_CHARS)]
TypeName = Annotated[str, Field(min_length=1, max_length=TYPE_CHARS, pattern=r"^[A-Za-z0-9_]+$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Start(_Strict):
    """Where the plan starts: entities by name, by type, or named entities of these types."""

    names: list[Name] = Field(default_factory=list, max_length=MAX_NAMES)
    types: list[TypeName] = Field(default_factory=list, max_length=MAX_TYPES)

    @model_validator(mode="after")
    def _something(self) -> Start:
        if not self.names and not self.types:
            raise ValueError("start needs names or types")
        return self


class Step(_Strict):
    """One step along relationships: of these types (none = any; ``typed``: any but
    co-occurrence, the extractor's untyped link), in this direction from the entities reached
    so far, repeated up to ``depth`` times."""

    relationships: list[TypeName] = Field(default_factory=list, max_length=MAX_TYPES)
    typed: bool = False
    direction: Direction = "out"
    depth: int = Field(default=1, ge=1, le=MAX_DEPTH)


class Related(_Strict):
    """The entities related to each result through one step (grouping key, degree, a
    relationship had or lacked), those of ``to_types`` only when it is given ("with no
    contract": no typed relationship to an entity of a contract's type)."""

    relationships: list[TypeName] = Field(default_factory=list, max_length=MAX_TYPES)
    typed: bool = False
    direction: Direction = "out"
    to_types: list[TypeName] = Field(default_factory=list, max_length=MAX_TYPES)


class Where(_Strict):
    """The reached entities kept: of these types, or (``like_start``) of the start entities'
    types ("what is affected if X fails": things of X's kind); that have a relationship of a
    step (``has``: "the vendors", those that supply something) or have none (``lacks``: "with
    no contract")."""

    types: list[TypeName] = Field(default_factory=list, max_length=MAX_TYPES)
    like_start: bool = False
    has: Related | None = None
    lacks: Related | None = None

    @model_validator(mode="after")
    def _something(self) -> Where:
        if not (self.types or self.like_start or self.has or self.lacks):
            raise ValueError("where needs types, like_start, has or lacks")
        return self


class Exclude(_Strict):
    """Negation: drop the entities one step from these named ones (relationship types and the
    direction from the named entities, as in a step)."""

    names: list[Name] = Field(min_length=1, max_length=MAX_NAMES)
    relationships: list[TypeName] = Field(default_factory=list, max_length=MAX_TYPES)
    direction: Direction = "both"


class Result(_Strict):
    """What the plan returns."""

    op: Literal["count", "list", "group", "rank", "compare"]
    group_by: Literal["type", "related"] = "type"
    rank_by: Literal["degree", "mentions", "pagerank"] = "degree"
    related: Related | None = None  # group_by "related", and the degree that rank counts
    limit: int = Field(default=50, ge=1, le=MAX_PAGE)
    offset: int = Field(default=0, ge=0, le=100_000)

    @model_validator(mode="after")
    def _related_when_needed(self) -> Result:
        if self.op == "group" and self.group_by == "related" and self.related is None:
            raise ValueError("group_by 'related' needs related (relationship types, direction)")
        return self


class Plan(_Strict):
    """A typed graph plan, version 1 (the module docstring says what each part does)."""

    schema_version: Literal[1] = 1  # PLAN_SCHEMA_VERSION
    start: Start
    follow: list[Step] = Field(default_factory=list, max_length=MAX_STEPS)
    where: Where | None = None
    exclude: Exclude | None = None
    result: Result

    @model_validator(mode="after")
    def _bounded(self) -> Plan:
        depth = sum(step.depth for step in self.follow)
        if depth > MAX_DEPTH:
            raise ValueError(f"the follow steps' depths add up to {depth}; at most {MAX_DEPTH}")
        if self.result.op == "compare" and (
            len(self.start.names) != 2 or self.follow or self.start.types
        ):
            raise ValueError("compare takes exactly two start names, and no types or steps")
        if len(set(self.start.names)) != len(self.start.names):
            raise ValueError("start names the same name twice")
        return self

    @property
    def depth(self) -> int:
        """The hops the plan may walk."""
        return sum(step.depth for step in self.follow)


def plan_json_schema() -> dict[str, Any]:
    """The JSON Schema of a plan (schemas/graph_plan.v1.json)."""
    schema = Plan.model_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://kgstream.dev/schemas/graph_plan.v1.json",
        "title": "kgstream graph plan v1",
        **{k: v for k, v in schema.items() if k != "title"},
    }


class Evidence(_Strict):
    """Why a row is in the answer: a sentence of a document the caller may read, and the
    relationship it states (none for an entity the plan started from: a sentence naming it)."""

    doc_id: str
    sentence: str
    relationship: str = ""  # "Source TYPE Target" as stored


class Row(_Strict):
    """One entity of the answer."""

    id: int
    name: str
    type: str
    hops: int = 0  # steps from the start (0: a start entity)
    value: float | None = None  # rank: the degree, mentions or PageRank
    evidence: list[Evidence] = Field(default_factory=list)


class Group(_Strict):
    """A group of the answer: its key, how many, and the first members (by name)."""

    key: str
    count: int
    members: list[str]


class Side(_Strict):
    """One side of a comparison."""

    entity: Row
    aliases: list[str]
    description: str
    mentions: int


class Comparison(_Strict):
    """Two entities side by side: their facts, and their neighbours shared and not."""

    a: Side
    b: Side
    shared: list[str]
    only_a: list[str]
    only_b: list[str]


class PlanAnswer(_Strict):
    """A plan's answer: the plan as executed (start entities resolved), what it counted or
    listed, each row's evidence, and notes (names that matched nothing, cuts)."""

    plan: Plan
    snapshot_id: int | None = None
    started_from: list[Row] = Field(default_factory=list)
    count: int = 0  # the entities the plan reached (before paging)
    rows: list[Row] = Field(default_factory=list)
    groups: list[Group] = Field(default_factory=list)
    comparison: Comparison | None = None
    statements: int = 0  # round trips the plan took
    notes: list[str] = Field(default_factory=list)


def plan_text(answer: PlanAnswer) -> str:
    """A plan's answer in words: the count; the entities listed, "; " between them; the top of
    a ranking (those tied at the top); the groups with their sizes; a comparison's shared and own
    neighbours. "I don't know" when the plan reached nothing (names the caller cannot see, or
    no relationship)."""
    op, rows = answer.plan.result.op, answer.rows
    if op == "compare" and answer.comparison is not None:
        said = _compared(answer.comparison)
    elif not answer.started_from:
        said = "I don't know: the question names no entity you can see in the graph."
    elif op == "count":
        said = str(answer.count)
    elif op == "group":
        said = "; ".join(f"{g.key}: {g.count}" for g in answer.groups) or "none"
    elif not rows:
        said = "I don't know: nothing in the graph is related to it that way."
    elif op == "rank" and rows[0].value is not None:  # "the most": the top, ties and all
        said = "; ".join(r.name for r in rows if r.value == rows[0].value)
    else:
        said = "; ".join(r.name for r in rows)
    return said


def _compared(c: Comparison) -> str:
    parts = [f"shared: {'; '.join(c.shared) or 'nothing'}"]
    parts.append(f"only {c.a.entity.name}: {'; '.join(c.only_a) or 'nothing'}")
    parts.append(f"only {c.b.entity.name}: {'; '.join(c.only_b) or 'nothing'}")
    return " | ".join(parts)
