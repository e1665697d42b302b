"""Chains of passages: the later hops of a multi-hop question, reached one bridge entity at a
time (issue 19; rules and figures in docs/retrieval.md, "Chains"). Pure functions (no I/O):
local.py fetches the links, the question's terms and the relevance.

A chain starts at one of the best passages of the first ranking (its head). Each step follows
a bridge entity, an entity of the chain's last passage that neither the question nor an earlier
passage of the chain named, to a passage that mentions it, when that passage

- is more relevant than the average candidate to what the chain has not covered yet: the fused
  dense and graph signals plus the lexical one on the question's uncovered terms only (Baleen's
  condensed query, without a model), z-scores over the candidates, so "above average" is > 0;
- and says something of the question the chain did not (one of its uncovered terms), or is
  about the bridge entity (its document's title is that entity: where the entity's facts are).

A step scores relevance plus the bridge's specificity: the bridge entity weighed like a seed
(grounding.seed_weight, IDF over passages), z-scored over the step's candidates (a rare name
links more surely than "Canadian").
The beam keeps the best few chains; a chain ends when no step meets the conditions, so the
number of steps follows the question and the graph, not a hop count.

The chains' later passages form a second ranking (hop by hop), interleaved with the first
after the heads: a passage reached only through a bridge entity gets a slot in the top k even
when the first hop's neighbours outscore it on the question alone."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt

from services.retrieval.grounding import seed_weight
from services.retrieval.ranking import zscores, zscores_array


@dataclass(frozen=True)
class Chain:
    """Passages in hop order, the sum of their step scores, the entities already used (the
    question's seeds and every passage's entities but the last one's) and the question's
    terms the passages contain."""

    passages: tuple[int, ...]
    score: float
    used: frozenset[int]
    covered: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ChainStart:
    """Chains that continue from passages already found instead of the first ranking's best
    (an LLM follow-up search, services/retrieval/multistep.py): ``heads`` start the chains,
    and no step bridges through the ``used`` entities (those the question and the earlier
    searches named), so the entity the follow-up query names can be the next bridge."""

    heads: tuple[int, ...]
    used: frozenset[int]


@dataclass
class Links:
    """The passage-entity links a chain may follow, from (entity, chunk) mention pairs."""

    entities_of: dict[int, set[int]] = field(default_factory=dict)  # chunk -> its entities
    passages_of: dict[int, set[int]] = field(default_factory=dict)  # entity -> its chunks
    about: dict[int, set[int]] = field(default_factory=dict)  # chunk -> its title's entities

    def add(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Index (entity, chunk) pairs both ways."""
        for entity, chunk in pairs:
            self.entities_of.setdefault(chunk, set()).add(entity)
            self.passages_of.setdefault(entity, set()).add(chunk)

    def add_about(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Index (chunk, entity) pairs of the entities passages are about."""
        for chunk, entity in pairs:
            self.about.setdefault(chunk, set()).add(entity)


@dataclass(frozen=True)
class Relevance:
    """Relevance to what a chain has not covered yet: ``base`` is the fused dense and graph
    signal over the candidates (z-scores with their fusion weights), to which the lexical
    signal on the uncovered question terms (Σ idf of those a passage contains, z-scored over
    the same candidates) is added with the lexical fusion weight."""

    base: Mapping[int, float]
    idf: Mapping[str, float]
    lexical_weight: float
    terms: Mapping[int, frozenset[str]]  # passage -> the question's terms it contains

    @cached_property
    def _passages(self) -> tuple[list[int], npt.NDArray[np.float64]]:
        """The candidates and their base scores as an array (every chain of a step reuses
        them)."""
        keys = list(self.base)
        return keys, np.fromiter(self.base.values(), np.float64, len(keys))

    @cached_property
    def _holds(self) -> tuple[list[str], npt.NDArray[np.float64]]:
        """The question terms some candidate contains, and which candidate holds which (one
        row per candidate, 1.0 where it holds the term): a chain's lexical scores are then
        one product with the idf of the terms it has not covered."""
        keys, _ = self._passages
        rows: list[int] = []
        held: list[str] = []
        for i, c in enumerate(keys):
            for term in self.terms.get(c, ()):
                rows.append(i)
                held.append(term)
        vocabulary = sorted(set(held))
        column = {term: j for j, term in enumerate(vocabulary)}
        holds = np.zeros((len(keys), len(vocabulary)))
        holds[rows, [column[term] for term in held]] = 1.0
        return vocabulary, holds

    @cached_property
    def _position(self) -> dict[int, int]:
        keys, _ = self._passages
        return {c: i for i, c in enumerate(keys)}

    def of(self, chain: Chain) -> Mapping[int, float]:
        """Passage -> relevance for this chain (a view on one array: a step looks up only
        the passages its chains reach, out of every candidate)."""
        if not self.lexical_weight:
            return self.base
        _, base = self._passages
        vocabulary, holds = self._holds
        weights = np.fromiter(
            (0.0 if t in chain.covered else self.idf.get(t, 0.0) for t in vocabulary),
            np.float64,
            len(vocabulary),
        )
        total = base + self.lexical_weight * zscores_array(holds @ weights)
        return _ArrayScores(self._position, total)


class _ArrayScores(Mapping[int, float]):
    """Scores held as an array, read by passage id."""

    def __init__(self, position: dict[int, int], values: npt.NDArray[np.float64]) -> None:
        self._position, self._values = position, values

    def __getitem__(self, passage: int) -> float:
        return float(self._values[self._position[passage]])

    def get(self, passage: int, default: float | None = None) -> float | None:  # type: ignore[override]
        at = self._position.get(passage)
        return default if at is None else float(self._values[at])

    def __iter__(self) -> Iterator[int]:
        return iter(self._position)

    def __len__(self) -> int:
        return len(self._position)


def starts(
    heads: Sequence[int],
    scores: Mapping[int, float],
    seeds: Iterable[int],
    terms: Mapping[int, frozenset[str]],
) -> list[Chain]:
    """One chain per head passage; the question's seeds count as used (they are not bridges)."""
    used = frozenset(seeds)
    return [Chain((h,), scores.get(h, 0.0), used, terms.get(h, frozenset())) for h in heads]


def frontier(chain: Chain, links: Links) -> set[int]:
    """The bridge entities of the chain's last passage: its entities nothing before named."""
    return links.entities_of.get(chain.passages[-1], set()) - chain.used


def reachable(chains: Iterable[Chain], links: Links) -> set[int]:
    """Every passage one bridge entity away from a chain's last passage (not in that chain)."""
    out: set[int] = set()
    for chain in chains:
        for entity in frontier(chain, links):
            out |= links.passages_of.get(entity, set()) - set(chain.passages)
    return out


def step(
    beam: Sequence[Chain], links: Links, relevance: Relevance, *, width: int, total: int
) -> tuple[list[Chain], list[Chain]]:
    """(the ``width`` best extended chains, the chains of ``beam`` that could not extend); the
    conditions and the score of a step are in the module docstring. ``total``: passages in the
    corpus."""
    none: frozenset[str] = frozenset()
    steps: dict[tuple[int, ...], tuple[Chain, float]] = {}  # chain -> (it, bridge specificity)
    ended: list[Chain] = []
    for chain in beam:
        scores = relevance.of(chain)
        bridges: dict[int, int] = {}  # next passage -> its rarest bridge's passage count
        for entity in frontier(chain, links):
            reached = links.passages_of.get(entity, set())
            for c in reached - set(chain.passages):
                says = relevance.terms.get(c, none) - chain.covered
                if scores.get(c, 0.0) > 0 and (says or entity in links.about.get(c, set())):
                    bridges[c] = min(bridges.get(c, len(reached)), len(reached))
        if not bridges:
            ended.append(chain)
            continue
        used = chain.used | links.entities_of.get(chain.passages[-1], set())
        for c, mentions in bridges.items():
            passages = (*chain.passages, c)
            covered = chain.covered | relevance.terms.get(c, none)
            grown = Chain(passages, chain.score + scores[c], used, covered)
            steps[passages] = (grown, seed_weight(1.0, mentions, total))
    linked = zscores({p: s for p, (_, s) in steps.items()})
    scored = [
        Chain(ch.passages, ch.score + linked[p], ch.used, ch.covered)
        for p, (ch, _) in steps.items()
    ]
    return sorted(scored, key=lambda ch: (-ch.score, ch.passages))[:width], ended


def ranking(heads: Sequence[int], chains: Iterable[Chain]) -> list[int]:
    """The chains' passages as one ranking, hop by hop: the heads in their first-ranking order
    (also those whose chains the beam dropped), then every chain's second passage (best chain
    first), then every third, and so on; each passage once. A chain's later hops are no more
    certain than its first, so they do not rank above another chain's first."""
    ordered = sorted(chains, key=lambda ch: (-ch.score, ch.passages))
    longest = max((len(ch.passages) for ch in ordered), default=0)
    later = (ch.passages[i] for i in range(1, longest) for ch in ordered if i < len(ch.passages))
    return list(dict.fromkeys([*heads, *later]))


def interleave(first: Sequence[int], second: Sequence[int]) -> list[int]:
    """Round-robin merge of two rankings (first, second, first, ...), each item once where it
    first appears: equal slots for the first ranking and the chains, neither preferred."""
    merged: dict[int, None] = {}
    for i in range(max(len(first), len(second))):
        for ranked in (first, second):
            if i < len(ranked):
                merged.setdefault(ranked[i], None)
    return list(merged)
