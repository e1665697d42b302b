"""Curations as resolution applies them: the rules in force, by normalised key. Pure: the
rules are read by services/core/curations.py (which also writes them) and applied here,
to one document's surfaces before its write plan resolves them (services/indexer/write_plan.py)
and to the stored entities a surface may join (services/indexer/graph_store/entities.py,
services/indexer/candidates.py).

Two kinds of rule reach resolution (docs/curation.md, "Curations"):
- a **redirect** (from ``merge``, ``alias`` and ``rename``): a surface keyed ``b`` resolves as if
  it were keyed ``a``, whatever its type;
- a **block** (from ``block`` and ``split``): a surface keyed ``a`` never joins an entity keyed
  ``b``, by key, alias, the document's short forms or a merge candidate, and the other way round.

Both are keyed by names, not entity ids, so they hold for documents not yet seen, and a rebuild
from the topic under the same rules gives the same graph."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# A redirect chain longer than this is refused when it is made (curations.py); resolution
# follows at most this many steps.
MAX_REDIRECTS = 8


@dataclass(frozen=True)
class CurationRules:
    """The rules in force at ``version`` (``kg_meta['curation_version']``)."""

    version: int = 0
    redirects: Mapping[str, str] = field(default_factory=dict)  # key -> key it resolves as
    blocks: frozenset[frozenset[str]] = frozenset()  # pairs of keys kept apart

    def target(self, key: str) -> str:
        """The key ``key`` resolves as, after every redirect."""
        return self.chain(key)[0]

    def chain(self, key: str) -> tuple[str, int]:
        """The key ``key`` resolves as, and the redirects followed to it (at most
        MAX_REDIRECTS)."""
        steps = 0
        while key in self.redirects and steps < MAX_REDIRECTS:
            key = self.redirects[key]
            steps += 1
        return key, steps

    def apart(self, a: str, b: str) -> bool:
        """A block rule keeps these two keys from one entity."""
        return a != b and frozenset((a, b)) in self.blocks

    def canonical(
        self, canonical: Mapping[str, str], keys: set[str]
    ) -> tuple[dict[str, str], set[str]]:
        """A document's short forms (own key -> key of the longer name) under the rules, and
        the keys a redirect rule sent surfaces to. A redirect wins over the document's own
        short form; a short form a block rule keeps apart from its long name stays its own
        name. ``keys``: the document's own surface keys."""
        out: dict[str, str] = {}
        forced: set[str] = set()
        targets = {self.target(k) for k in self.redirects}
        for own in sorted(keys):
            if own in self.redirects:
                key = self.target(own)
            else:
                key = canonical.get(own, own)
                if self.apart(own, key):
                    key = own
                key = self.target(key)
            if key in targets:
                # Joined by a person's word: one entity whatever types the names get, so the
                # result does not depend on which name arrives first.
                forced.add(key)
            if key != own:
                out[own] = key
        return out, forced


NO_RULES = CurationRules()
