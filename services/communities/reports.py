"""Community reports: what a report writer is given, what it returns, and the offline
extractive writer (title from the keyphrases of the community's passages, services/communities/
keyphrases.py; summary opening with those themes, then the top entities by PageRank, the key
relationships and representative sentences of the members' descriptions)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.communities.keyphrases import TITLE_PHRASES, theme_title

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class EntityFact:
    """A member entity, most important first (PageRank)."""

    name: str
    type: str
    description: str
    pagerank: float


@dataclass(frozen=True)
class RelationFact:
    """An internal relationship, heaviest first."""

    source: str
    target: str
    type: str
    description: str
    weight: float


@dataclass(frozen=True)
class ChildSummary:
    """A sub-community's report, for reports built from their children."""

    title: str
    summary: str
    size: int


@dataclass(frozen=True)
class ReportInput:
    """Everything one report is written from."""

    community_id: int
    level: int
    size: int
    internal_weight: float
    max_weight: float  # the heaviest community of the level, to normalise the rating
    entities: Sequence[EntityFact]
    relations: Sequence[RelationFact]
    children: Sequence[ChildSummary] = ()
    keyphrases: Sequence[str] = ()  # what its passages are about, heaviest first


@dataclass(frozen=True)
class Finding:
    """One insight of a report."""

    summary: str
    explanation: str


@dataclass(frozen=True)
class Report:
    """A community report; ``writer`` names who wrote it (reuse needs the same writer)."""

    title: str
    summary: str
    findings: Sequence[Finding]
    rating: float
    writer: str
    usage: tuple[int, int] = field(default=(0, 0))  # prompt, completion tokens

    def as_json(self) -> dict[str, Any]:
        """The ``communities.report`` document."""
        return {
            "title": self.title,
            "summary": self.summary,
            "findings": [
                {"summary": f.summary, "explanation": f.explanation} for f in self.findings
            ],
            "rating": self.rating,
            "writer": self.writer,
        }


class ReportWriter(Protocol):
    """Writes reports; synchronous (callers run it in a thread). ``name`` is stored with each
    report, and a report is reused only by the writer that wrote it. ``passages``: how many
    passages per community its ``keyphrases`` are read from (0: none are read)."""

    name: str
    max_entities: int
    max_relations: int
    passages: int

    def write(self, inputs: Sequence[ReportInput]) -> list[Report]:
        """One report per input, in order."""
        ...


class ExtractiveWriter:
    """Offline reports from the facts themselves; no model, no network."""

    # The rule's version is part of the name, so reports of an earlier rule are rewritten once,
    # not reused (reuse needs the same fingerprint and the same writer): raise it whenever
    # what this writer writes from the same facts changes. Earlier: "extractive" (titles of
    # entity names), "extractive-themes" (keyphrases from every n-gram, not noun-phrase tails).
    name = "extractive:3"
    max_entities = 12
    max_relations = 8
    passages = 8  # per community: enough for its themes, a fixed cost per written report

    def write(self, inputs: Sequence[ReportInput]) -> list[Report]:
        """One report per input, in order."""
        return [extractive_report(item) for item in inputs]


def extractive_report(item: ReportInput) -> Report:
    """Title: the first keyphrases (else the top entities by PageRank); summary: the themes,
    then the top entities, key relationships and representative sentences; findings: one per
    key relationship and top entity; rating: 1-10 by the community's internal weight relative
    to the heaviest community of its level."""
    names = [e.name for e in item.entities[:3]]
    title = theme_title(item.keyphrases[:TITLE_PHRASES]) or (
        _join(names) if names else f"Community {item.community_id}"
    )
    key_relations = [_relation_text(r) for r in item.relations[:3]]
    sentences = _representative_sentences(item.entities, 3)
    parts = [f"Themes: {', '.join(item.keyphrases)}."] if item.keyphrases else []
    parts.append(f"{item.size} entities" + (f" around {_join(names)}." if names else "."))
    if key_relations:
        parts.append("Key relationships: " + "; ".join(key_relations) + ".")
    if item.children:
        titles = list(dict.fromkeys(c.title for c in item.children[:4]))  # siblings may share
        parts.append("Sub-communities: " + "; ".join(titles) + ".")
    parts.extend(sentences)
    findings = [
        Finding(summary=_relation_text(r), explanation=_first_sentences(r.description, 2))
        for r in item.relations[:3]
    ] + [
        Finding(summary=f"{e.name} ({e.type})", explanation=_first_sentences(e.description, 2))
        for e in item.entities[:3]
    ]
    return Report(
        title=title,
        summary=" ".join(parts),
        findings=findings,
        rating=rating(item.internal_weight, item.max_weight),
        writer=ExtractiveWriter.name,
    )


def rating(weight: float, max_weight: float) -> float:
    """1.0 for an edgeless community up to 10.0 for the level's heaviest, log-scaled."""
    if max_weight <= 0:
        return 1.0
    return round(1.0 + 9.0 * math.log1p(max(weight, 0.0)) / math.log1p(max_weight), 2)


def _relation_text(r: RelationFact) -> str:
    return f"{r.source} {r.type.replace('_', ' ').lower()} {r.target}"


def _representative_sentences(entities: Sequence[EntityFact], limit: int) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for entity in entities:
        sentence = _first_sentences(entity.description, 1)
        if sentence and sentence not in seen:
            seen.add(sentence)
            out.append(sentence)
        if len(out) == limit:
            break
    return out


def _first_sentences(description: str, count: int) -> str:
    return " ".join(_SENTENCE_END.split(description.strip())[:count]).strip()


def _join(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
