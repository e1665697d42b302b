"""The query API's own request and response models (never ORM rows on the wire)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Mode = Literal["vector", "local"]


class QueryRequest(BaseModel):
    """A question and how to answer it."""

    question: str = Field(min_length=1, max_length=2000, description="The question.")
    mode: Literal["auto", "vector", "local"] = Field(default="auto", description="Retrieval mode.")
    k: int = Field(default=5, ge=1, le=50, description="Contexts to return.")
    explain: bool = Field(default=True, description="Include paths and grounding.")


class Context(BaseModel):
    """One retrieved passage."""

    doc_id: str
    chunk_id: int
    title: str
    text: str
    score: float
    why: str = ""


class PathStep(BaseModel):
    """One explained hop: entity --relation--> entity, with the evidence sentence."""

    source: str
    relation: str
    target: str
    evidence: str


class QueryResponse(BaseModel):
    """Answer plus the contexts it came from."""

    answer: str
    mode_used: Mode
    snapshot_id: int | None = None
    contexts: list[Context]
    grounded_entities: list[str] = Field(default_factory=list)
    paths: list[PathStep] = Field(default_factory=list)
    timings: dict[str, float] = Field(default_factory=dict)
