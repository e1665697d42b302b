"""Chains of passages: the later hops of a multi-hop question, reached one bridge entity at a
time (issue 19). A chain starts at one of the best passages of the first ranking; each step
follows an entity of the chain's last passage that nothing earlier in the chain (nor the
question) named, to a passage that mentions it and is more relevant to the question than the
average candidate. The beam keeps the best few chains; a chain stops when no step is left that
meets both conditions, so the number of steps follows the question and the graph. Pure
functions (no I/O); local.py fetches the links and the relevance.

The chains' passages, best chain first and each chain in hop order, form one more ranking,
fused with the first by reciprocal rank (services/query_api/ranking.rrf): a passage reached
only through a bridge entity then gets a slot in the top k even when the first hop's
neighbours outscore it on the question alone."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Chain:
    """Passages in hop order, the sum of their relevance, and the entities already used (the
    question's seeds and every passage's entities but the last one's)."""

    passages: tuple[int, ...]
    score: float
    used: frozenset[int]
    covered: frozenset[str] = frozenset()  # the question's terms the passages contain


@dataclass
class Links:
    """The passage-entity links a chain may follow, from (entity, chunk) mention pairs."""

    entities_of: dict[int, set[int]]  # chunk -> its (non-hub) entities
    passages_of: dict[int, set[int]]  # entity -> the chunks that mention it

    @classmethod
    def of(cls, pairs: Iterable[tuple[int, int]]) -> Links:
        """Index (entity, chunk) pairs both ways."""
        links = cls({}, {})
        links.add(pairs)
        return links

    def add(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Index more pairs."""
        for entity, chunk in pairs:
            self.entities_of.setdefault(chunk, set()).add(entity)
            self.passages_of.setdefault(entity, set()).add(chunk)


def starts(
    heads: Sequence[int],
    relevance: Mapping[int, float],
    seeds: Iterable[int],
    terms: Mapping[int, frozenset[str]],
) -> list[Chain]:
    """One chain per head passage; the question's seeds count as used (they are not bridges)."""
    used = frozenset(seeds)
    return [Chain((h,), relevance.get(h, 0.0), used, terms.get(h, frozenset())) for h in heads]


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
    beam: Sequence[Chain],
    links: Links,
    relevance: Mapping[int, float],
    terms: Mapping[int, frozenset[str]],
    width: int,
) -> tuple[list[Chain], list[Chain]]:
    """(the ``width`` best extended chains, the chains of ``beam`` that could not extend). A
    chain extends to a passage reached through one of its bridge entities that says something
    of the question no passage of the chain said (one of its terms: the rest of the question,
    as a condensed query would ask it) and whose relevance is positive (above the candidates'
    mean: relevance is a sum of z-scores)."""
    grown: dict[tuple[int, ...], Chain] = {}
    ended: list[Chain] = []
    for chain in beam:
        bridges = frontier(chain, links)
        nexts = {
            c
            for e in bridges
            for c in links.passages_of.get(e, set())
            if c not in chain.passages
            and relevance.get(c, 0.0) > 0
            and terms.get(c, frozenset()) - chain.covered
        }
        if not nexts:
            ended.append(chain)
            continue
        used = chain.used | links.entities_of.get(chain.passages[-1], set())
        for c in nexts:
            passages = (*chain.passages, c)
            covered = chain.covered | terms.get(c, frozenset())
            grown[passages] = Chain(passages, chain.score + relevance[c], used, covered)
    best = sorted(grown.values(), key=lambda ch: (-ch.score, ch.passages))[:width]
    return best, ended


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
