"""Re-seeding local retrieval's walk: the later hops of a multi-hop question hang off the
first hop's answers, not the question's own names. The bridge entities are the entities of
the best passages after a first ranking that the question did not name; a second walk
restarts from them as well as from the question's seeds. Pure functions (no I/O)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from services.retrieval.grounding import seed_weight


def passage_counts(mentions: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Entity -> the passages of the graph that mention it ((entity, chunk) pairs). Every
    expanded entity's mentions are fetched whole, so this is its visible document frequency."""
    out: dict[int, int] = {}
    for entity, _ in set(mentions):
        out[entity] = out.get(entity, 0) + 1
    return out


def bridge_seeds(
    top: Sequence[int],
    mentions: Iterable[tuple[int, int]],
    known: Iterable[int],
    total_chunks: int,
) -> dict[int, float]:
    """The entities of the ``top`` passages that are not ``known`` (the question's seeds),
    each weighted like a seed: exact match (1.0) × IDF over the passages that mention it."""
    pairs = set(mentions)
    wanted, skip = set(top), set(known)
    counts = passage_counts(pairs)
    found = {e for e, c in pairs if c in wanted and e not in skip}
    return {e: seed_weight(1.0, counts[e], total_chunks) for e in sorted(found)}


def split_reset(first: Mapping[int, float], second: Mapping[int, float]) -> dict[int, float]:
    """One reset vector with equal mass on two seed sets (each normalised to sum 1): PPR is
    linear in its reset vector, so this walk is the mean of one walk from each set."""
    out: dict[int, float] = {}
    for group in (first, second):
        total = sum(w for w in group.values() if w > 0)
        for e, w in group.items():
            if w > 0 and total > 0:
                out[e] = out.get(e, 0.0) + w / total
    return out


def reached_passages(
    entities: Iterable[int], mentions: Iterable[tuple[int, int]], skip: Iterable[int]
) -> list[int]:
    """The passages that mention any of these entities, except ``skip`` (sorted)."""
    wanted, done = set(entities), set(skip)
    return sorted({c for e, c in mentions if e in wanted and c not in done})
