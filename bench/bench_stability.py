"""Community stability under edge churn (issue 10, deliverable 6).

On seeded synthetic graphs with planted, nested communities (``bench_recompute.planted_graph``)
a first build is made, then ``--steps`` rounds of churn are applied, each removing 5% of the
edges and adding 5% new ones (drawn like the graph's own: 85% inside a planted community, the
rest to the community's group or anywhere; weights 1-5; seeded). After each round, on the same
graph and from the same previous snapshot, it runs:

- ``warm``: today's recompute (``compute_structure``: igraph Leiden over all nodes warm-started
  from the previous level 0, reused or warm-started splits);
- ``fixed_rR``: the incremental level 0 (leidenalg, ``is_membership_fixed``;
  bench/incremental_leiden.py): nodes farther than R hops from an endpoint of a removed or added
  edge keep their community, the rest are optimised; then the same splitting as ``warm``;
- ``fixed_rR_splits``: the same fixed membership at every split level too (leidenalg CPM);
- ``cold``: a first build of the new graph (no warm start), ids matched to the previous snapshot;
- ``keep``: no recompute at all (the previous level 0 on the new graph), as a reference for
  modularity.

Each method's chain continues from its own previous snapshot. Per method and round: fraction
of nodes whose community id changed at each level (ids as the published snapshot would show
them, i.e. after stable-id matching; over nodes in a community at that level before or after),
level-0 modularity on the new graph, and wall time of the compute (Leiden, PageRank, ids,
fingerprints). Target: <= 10% of nodes change community at level 0 after a 10% churn.

    .venv/bin/python bench/bench_stability.py [--quick] [--sizes 100000] [--repeats 3]
        [--steps 3] [--radii 0,1] [--max-size 10]

Prints one JSON object per (size, repeat, step, method), then a table of medians over repeats.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import igraph as ig
import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
for path in (REPO_ROOT, REPO_ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_recompute import F64, I64, Planted, planted_graph, planted_pairs  # noqa: E402
from incremental_leiden import Incremental, near, node_ids, previous_of  # noqa: E402

from services.communities.graph import GraphRows  # noqa: E402
from services.communities.leiden import LeidenConfig  # noqa: E402
from services.communities.stable_ids import OldLevel, match_level  # noqa: E402
from services.communities.structure import Level, Structure, compute_structure  # noqa: E402

MIN_JACCARD = 0.3  # RecomputeDeps' default
Edges = tuple[int, I64, I64, F64]


def rows_of(n: int, src: I64, dst: I64, weight: F64) -> GraphRows:
    """Entities 1..n, one relationship per edge (id from the pair, so a kept edge keeps it)."""
    key = src * n + dst + 1
    return GraphRows(
        entity_ids=np.arange(1, n + 1, dtype=np.int64),
        entity_digests=np.zeros(n, dtype="V16"),
        rel_ids=key,
        rel_src=src + 1,
        rel_dst=dst + 1,
        rel_weight=weight,
        rel_digests=np.zeros(len(key), dtype="V16"),
    )


def churn(p: Planted, graph: Edges, rate: float, rng: np.random.Generator) -> tuple[Edges, I64]:
    """Remove ``rate / 2`` of the edges and add as many new ones; return the new graph and the
    touched nodes (endpoints of removed and added edges)."""
    n, src, dst, weight = graph
    k = int(len(src) * rate / 2)
    gone = rng.choice(len(src), k, replace=False)
    keep = np.ones(len(src), dtype=bool)
    keep[gone] = False
    a, b = planted_pairs(p, 4 * k, rng, mu=0.15)
    old_keys = src * n + dst
    fresh = np.setdiff1d(np.unique(a * n + b), old_keys)
    added = rng.permutation(fresh)[:k]
    keys = np.concatenate([old_keys[keep], added])
    w = np.concatenate([weight[keep], rng.integers(1, 6, len(added)).astype(np.float64)])
    order = np.argsort(keys)
    keys, w = keys[order], w[order]
    touched = np.unique(np.concatenate([src[gone], dst[gone], added // n, added % n]))
    return (n, keys // n, keys % n, w), touched


def rematch(new: Structure, old: Structure, next_id: int) -> Structure:
    """Ids of a cold build matched to ``old`` level by level, as compute_structure does."""
    levels: list[Level] = []
    for number, level in enumerate(new.levels):
        old_level = None
        if number < len(old.levels):
            at = node_ids(old, number)
            nodes = np.flatnonzero(at >= 0)
            prev = old.levels[number]
            old_level = OldLevel(nodes, at[nodes], prev.ids, prev.sizes)
        ids, next_id = match_level(level.labels, old_level, MIN_JACCARD, next_id)
        parent_ids = levels[-1].ids[_parents(new, number)] if number else level.parent_ids
        levels.append(replace(level, ids=ids, parent_ids=parent_ids))
    return replace(new, levels=levels)


def _parents(structure: Structure, number: int) -> I64:
    """Level-``number`` community -> parent label (from the node labels)."""
    level, up = structure.levels[number], structure.levels[number - 1]
    out = np.full(len(level.ids), -1, dtype=np.int64)
    member = level.labels >= 0
    out[level.labels[member]] = up.labels[member]
    return out


def changed(old: Structure, new: Structure) -> list[float]:
    """Per level: fraction of nodes (in a community at that level before or after) whose
    community id differs."""
    out = []
    for number in range(max(len(old.levels), len(new.levels))):
        a, b = node_ids(old, number), node_ids(new, number)
        scope = (a >= 0) | (b >= 0)
        out.append(round(float((a[scope] != b[scope]).mean()) if scope.any() else 0.0, 4))
    return out


def reports(old: Structure, new: Structure) -> list[list[int]]:
    """Per level: [communities whose fingerprint no old community had, communities]: the
    reports a recompute writes again (an unchanged fingerprint keeps its report)."""
    before = {f for level in old.levels for f in level.fingerprints}
    return [
        [sum(f not in before for f in level.fingerprints), len(level.fingerprints)]
        for level in new.levels
    ]


def modularity(graph: Edges, labels: I64) -> float:
    """Modularity on the whole graph (nodes without a community as singletons)."""
    n, src, dst, weight = graph
    lab = labels.copy()
    loose = np.flatnonzero(lab < 0)
    lab[loose] = lab.max() + 1 + np.arange(len(loose))
    g = ig.Graph(n=n, edges=np.column_stack([src, dst]).tolist())
    dense = np.unique(lab, return_inverse=True)[1].tolist()
    return round(float(g.modularity(dense, weights=weight.tolist())), 4)


def next_free(structure: Structure) -> int:
    return int(max(int(level.ids.max(initial=0)) for level in structure.levels)) + 1


def run_size(size: int, repeat: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    p, graph = planted_graph(size, seed=7 + repeat)
    rng = np.random.default_rng(1000 + repeat)
    base_config = LeidenConfig(max_sizes=(args.max_size,), seed=42)
    first = compute_structure(rows_of(*graph), None, base_config, MIN_JACCARD, 1)
    methods = ["warm", *(f"hyst_{m:g}" for m in args.margins), *(f"fixed_r{r}" for r in args.radii)]
    methods += [*(f"fixed_r{r}_splits" for r in args.radii), "cold", "keep"]
    if importlib.util.find_spec("leidenalg") is None:  # dropped from the dependencies
        print("leidenalg is not installed: fixed_* methods skipped", file=sys.stderr)
        methods = [m for m in methods if not m.startswith("fixed_")]
    state = dict.fromkeys(methods, first)
    rows: list[dict[str, Any]] = []
    for step in range(1, args.steps + 1):
        graph, touched = churn(p, graph, args.churn, rng)
        new_rows = rows_of(*graph)
        for method in methods:
            old = state[method]
            t0 = time.perf_counter()
            if method == "keep":
                result = old
            elif method == "cold":
                cold = compute_structure(new_rows, None, base_config, MIN_JACCARD, 1)
                result = rematch(cold, old, next_free(old))
            elif method == "warm":
                result = compute_structure(
                    new_rows, previous_of(old), base_config, MIN_JACCARD, next_free(old)
                )
            elif method.startswith("hyst_"):
                hyst = replace(base_config, resplit_margin=float(method.split("_")[1]))
                result = compute_structure(
                    new_rows, previous_of(old), hyst, MIN_JACCARD, next_free(old)
                )
            else:
                radius = int(method.split("_")[1][1:])
                moving = near(graph[1], graph[2], np.isin(np.arange(graph[0]), touched), radius)
                old_at = [node_ids(old, number) for number in range(len(old.levels))]
                with Incremental(old_at, moving, splits=method.endswith("_splits")):
                    result = compute_structure(
                        new_rows, previous_of(old), base_config, MIN_JACCARD, next_free(old)
                    )
            wall = time.perf_counter() - t0
            state[method] = result
            rows.append(
                {
                    "edges": len(graph[1]),
                    "nodes": graph[0],
                    "repeat": repeat,
                    "step": step,
                    "method": method,
                    "touched_nodes": round(len(touched) / graph[0], 4),
                    "changed_by_level": changed(old, result),
                    "reports_by_level": reports(old, result),
                    "modularity": modularity(graph, result.levels[0].labels),
                    "modularity_by_level": [modularity(graph, lv.labels) for lv in result.levels],
                    "levels": len(result.levels),
                    "communities": result.community_count,
                    "leiden_s": round(result.timings.get("leiden_s", 0.0), 3)
                    if method != "keep"
                    else 0.0,
                    "compute_s": round(wall, 3),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> None:
    """Medians over repeats per (edges, step, method)."""
    print("\nmedians over repeats (changed: level 0 | all levels; target level 0 <= 0.10)")
    print(
        f"{'edges':>8} {'step':>4} {'method':<9} {'changed L0':>10} {'by level':<36} "
        f"{'modularity':>10} {'leiden s':>8} {'compute s':>9}"
    )
    order = list(dict.fromkeys(r["method"] for r in rows))
    keys = sorted(
        {(r["edges"] // 1000, r["step"], r["method"]) for r in rows},
        key=lambda k: (k[0], k[1], order.index(k[2])),
    )
    for edges_k, step, method in keys:
        mine = [
            r
            for r in rows
            if (r["edges"] // 1000, r["step"], r["method"]) == (edges_k, step, method)
        ]
        depth = max(len(r["changed_by_level"]) for r in mine)
        by_level = [
            statistics.median(
                r["changed_by_level"][i] for r in mine if i < len(r["changed_by_level"])
            )
            for i in range(depth)
        ]
        print(
            f"{statistics.median(r['edges'] for r in mine):>8.0f} {step:>4} {method:<9} "
            f"{by_level[0]:>10.4f} {json.dumps([round(x, 3) for x in by_level]):<36} "
            f"{statistics.median(r['modularity'] for r in mine):>10.4f} "
            f"{statistics.median(r['leiden_s'] for r in mine):>8.3f} "
            f"{statistics.median(r['compute_s'] for r in mine):>9.3f}"
        )


def main() -> None:
    """Run the benchmark and print JSON lines and a table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="10k edges, 1 repeat, 2 steps")
    parser.add_argument("--sizes", default="100000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="successive churn rounds")
    parser.add_argument("--churn", type=float, default=0.10, help="edges removed + added")
    parser.add_argument("--radii", default="0,1", help="neighbourhood radii for fixed_rR")
    parser.add_argument("--max-size", type=int, default=10, help="community size bound")
    parser.add_argument(
        "--margins",
        default="",
        help="re-split margins for hyst_M (LeidenConfig.resplit_margin), e.g. 0,0.01,0.05",
    )
    args = parser.parse_args()
    args.radii = [int(r) for r in args.radii.split(",") if r != ""]
    args.margins = [float(m) for m in args.margins.split(",") if m != ""]
    if args.quick:
        args.sizes, args.repeats, args.steps = "10000", 1, 2
    rows: list[dict[str, Any]] = []
    for size in [int(s) for s in args.sizes.split(",")]:
        for repeat in range(args.repeats):
            rows += run_size(size, repeat, args)
    summary(rows)


if __name__ == "__main__":
    main()
