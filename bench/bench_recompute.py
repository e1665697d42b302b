"""Community recompute benchmark (docs/architecture.md, "Performance targets": "Recompute at 1M
edges").

For synthetic graphs of 10k, 100k and 1M edges (seeded generator with planted, nested
community structure) it times, in the same run and on the same edge lists:

1. our hierarchy (``services.communities.leiden.hierarchical_leiden``, igraph's Leiden) vs
   graspologic-native's ``hierarchical_leiden`` with the same size bound, resolution and seed,
   plus both level-0 modularities (same quality?);
2. a whole recompute without summaries against PostgreSQL: entities and relationships are
   created with COPY, then ``recompute()`` loads them (packed bytea), runs Leiden, PageRank,
   stable ids and fingerprints in a worker process (as the communities worker does), writes
   the snapshot rows and publishes; then a second recompute on the unchanged graph (warm start,
   previous snapshot to match, retention of 1: it prunes the first snapshot and its rows).

    .venv/bin/python bench/bench_recompute.py [--sizes 10000,100000,1000000] [--repeat 3]
        [--database-url postgresql://...]  # default: an embedded PostgreSQL in a temp dir
        [--skip-db] [--max-size 10] [--quick]  # --quick: 10k edges, one run

Every repeat uses a fresh database. Prints one JSON object per size and repeat, then one
line per size with the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from services.communities.leiden import LeidenConfig, hierarchical_leiden  # noqa: E402

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Planted:
    """Planted communities: node ``i`` is in community ``community[i]``; community ``c`` is
    nodes ``start[c] .. start[c] + size[c] - 1``; groups of 12 consecutive communities."""

    n: int
    size: I64
    start: I64
    community: I64


def planted(n_edges: int, rng: np.random.Generator, avg_degree: float = 8.0) -> Planted:
    """``n_edges * 2 / avg_degree`` nodes in communities of 8-400 nodes (power law)."""
    n = int(n_edges * 2 / avg_degree)
    sizes: list[int] = []
    while sum(sizes) < n:
        sizes.append(min(400, int(8 * (1 - rng.random()) ** (-1 / 1.5)), n - sum(sizes)))
    size = np.array(sizes, dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(size)[:-1]])
    return Planted(n, size, start, np.repeat(np.arange(len(size)), size))


def planted_pairs(p: Planted, m: int, rng: np.random.Generator, mu: float) -> tuple[I64, I64]:
    """Up to ``m`` node pairs (a < b, loops dropped, duplicates possible): a pair stays inside
    its community with probability 1 - mu, else goes to the group (3/4 of those) or anywhere."""
    n, size, start = p.n, p.size, p.start
    src = rng.integers(0, n, m)
    c = p.community[src]
    r = rng.random(m)
    dst = rng.integers(0, n, m)  # "anywhere" by default
    inside = r >= mu
    dst[inside] = start[c[inside]] + (rng.random(inside.sum()) * size[c[inside]]).astype(np.int64)
    group = (r < mu) & (r >= mu / 4)
    first = (c[group] // 12) * 12
    other = first + (rng.random(group.sum()) * np.minimum(12, len(size) - first)).astype(np.int64)
    dst[group] = start[other] + (rng.random(group.sum()) * size[other]).astype(np.int64)
    a, b = np.minimum(src, dst), np.maximum(src, dst)
    keep = a != b
    return a[keep], b[keep]


def planted_graph(
    n_edges: int, seed: int = 7, avg_degree: float = 8.0, mu: float = 0.15
) -> tuple[Planted, tuple[int, I64, I64, F64]]:
    """The planted communities and ``synthetic_graph``'s edges (same seed, same output)."""
    rng = np.random.default_rng(seed)
    p = planted(n_edges, rng, avg_degree)
    a, b = planted_pairs(p, int(n_edges * 1.3), rng, mu)
    n = p.n
    keys = rng.permutation(np.unique(a * n + b))[:n_edges]
    keys.sort()
    weight = rng.integers(1, 6, len(keys)).astype(np.float64)
    return p, (n, keys // n, keys % n, weight)


def synthetic_graph(
    n_edges: int, seed: int = 7, avg_degree: float = 8.0, mu: float = 0.15
) -> tuple[int, I64, I64, F64]:
    """``n_edges`` distinct undirected edges (src < dst, sorted) on ``n_edges / 4`` nodes.
    Communities of 8-400 nodes (power law) in groups of 12; an edge stays inside its
    community with probability 1 - mu, else goes to the group (3/4 of those) or anywhere."""
    return planted_graph(n_edges, seed, avg_degree, mu)[1]


def bench_hierarchies(n: int, src: I64, dst: I64, weight: F64, *, max_size: int) -> dict[str, Any]:
    """Our hierarchy vs graspologic-native's on the same edges."""
    import graspologic_native as gn
    import igraph as ig

    out: dict[str, Any] = {}
    level0s: dict[str, I64] = {}
    configs = {
        "ours": LeidenConfig(max_sizes=(max_size,), seed=42),  # the defaults (as settings)
        "ours_1_iteration": LeidenConfig(
            max_sizes=(max_size,), iterations=1, split_iterations=1, seed=42
        ),
    }
    for name, config in configs.items():
        t0 = time.perf_counter()
        ours = hierarchical_leiden(n, src, dst, weight, config=config)
        out[f"{name}_s"] = round(time.perf_counter() - t0, 3)
        out[f"{name}_levels"] = ours.levels
        out[f"{name}_communities"] = sum(len(p) for p in ours.parents)
        level0s[name] = ours.labels[0]
    t0 = time.perf_counter()
    edges = list(zip(map(str, src.tolist()), map(str, dst.tolist()), weight.tolist(), strict=True))
    out["graspologic_edge_list_s"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    clusters = gn.hierarchical_leiden(
        edges, max_cluster_size=max_size, seed=42, resolution=1.0, use_modularity=True
    )
    out["graspologic_s"] = round(time.perf_counter() - t0, 3)
    out["graspologic_levels"] = 1 + max(c.level for c in clusters)
    out["graspologic_communities"] = len({(c.level, c.cluster) for c in clusters})
    gn_level0 = np.full(n, -1, dtype=np.int64)
    for c in clusters:
        if c.level == 0:
            gn_level0[int(c.node)] = c.cluster
    g = ig.Graph(n=n, edges=list(zip(src.tolist(), dst.tolist(), strict=True)))
    w = weight.tolist()
    for name, level0 in level0s.items():
        out[f"{name}_level0_modularity"] = round(g.modularity(_dense(level0), weights=w), 4)
    out["graspologic_level0_modularity"] = round(g.modularity(_dense(gn_level0), weights=w), 4)
    return out


def _dense(labels: I64) -> list[int]:
    """Isolated nodes (-1) as singletons, for igraph's modularity."""
    out = labels.copy()
    loose = np.flatnonzero(out < 0)
    out[loose] = out.max() + 1 + np.arange(len(loose))
    dense: list[int] = np.unique(out, return_inverse=True)[1].tolist()
    return dense


async def bench_recompute(
    url: str, graph: tuple[int, I64, I64, F64], *, max_size: int
) -> dict[str, Any]:
    """Load synthetic rows with COPY, then two recomputes without summaries."""
    from services.communities.recompute import RecomputeDeps, recompute
    from services.communities.worker import run_now
    from services.core.db.engine import UNBOUNDED, make_engine

    t0 = time.perf_counter()
    await _load_rows(url, *graph)
    setup_s = time.perf_counter() - t0
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    pool.submit(_warm_up).result()  # the worker's pool is long-lived: no import cost per run
    deps = RecomputeDeps(
        engine=make_engine(url, timeouts=UNBOUNDED),
        database_url=url,
        leiden=LeidenConfig(max_sizes=(max_size,), seed=42),
        keep=1,  # the warm run prunes the cold snapshot: pruning is part of its total
        executor=pool,
    )
    out: dict[str, Any] = {"setup_copy_s": round(setup_s, 2)}
    try:
        for run in ("cold", "warm"):
            t0 = time.perf_counter()
            result = await (run_now(deps, "bench") if run == "cold" else recompute(deps, "bench"))
            total = time.perf_counter() - t0
            assert result is not None
            out[f"{run}_total_s"] = round(total, 2)
            out[f"{run}_stages"] = {k: round(v, 2) for k, v in result.timings.items()}
            out[f"{run}_communities"] = result.snapshot.communities
            out[f"{run}_levels"] = result.snapshot.levels
    finally:
        await deps.engine.dispose()
        pool.shutdown()
    return out


def _warm_up() -> None:
    import services.communities.structure  # noqa: F401


async def _load_rows(url: str, n: int, src: I64, dst: I64, weight: F64) -> None:
    import psycopg

    from services.communities.lock import libpq_url

    async with await psycopg.AsyncConnection.connect(libpq_url(url)) as conn:
        cur = conn.cursor()
        async with cur.copy("COPY entities (key, name, type, description) FROM STDIN") as copy:
            buf = io.StringIO()
            for i in range(n):
                buf.write(f"e{i}\tEntity {i}\tCONCEPT\tSynthetic entity {i}.\n")
            await copy.write(buf.getvalue())
        async with cur.copy(
            "COPY relationships (source_id, target_id, type, weight) FROM STDIN"
        ) as copy:
            # A fresh database numbers entities 1..n in COPY order.
            lines = np.char.add(
                np.char.add(np.char.add((src + 1).astype(str), "\t"), (dst + 1).astype(str)),
                np.char.add("\trelated_to\t", weight.astype(str)),
            )
            await copy.write("\n".join(lines.tolist()) + "\n")
        await conn.commit()
        await conn.execute("ANALYZE entities")
        await conn.execute("ANALYZE relationships")


def _fresh_database(server_url: str) -> str:
    import psycopg

    from services.communities.lock import libpq_url
    from services.core.db import migrations

    name = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = server_url.rsplit("/", 1)[0] + "/" + name
    migrations.upgrade(url, 384)
    return url


def main() -> None:
    """Run the benchmark and print JSON lines and the medians."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--repeat", type=int, default=1, help="runs per size (median)")
    parser.add_argument("--quick", action="store_true", help="10k edges, one run")
    parser.add_argument("--database-url", default=None, help="server URL; default: embedded")
    parser.add_argument("--skip-db", action="store_true", help="only the hierarchy timings")
    parser.add_argument("--max-size", type=int, default=10, help="community size bound")
    args = parser.parse_args()
    sizes = [10000] if args.quick else [int(s) for s in args.sizes.split(",")]
    repeat = 1 if args.quick else args.repeat

    from services.core.settings import Settings

    server_url = args.database_url and Settings(database_url=args.database_url).database_url
    embedded = None
    if not args.skip_db and server_url is None:
        from services.core.infra.postgres import EmbeddedPostgres

        embedded = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="kgstream-bench-")))
        server_url = embedded.start()
    try:
        for size in sizes:
            graph = synthetic_graph(size)
            n, src, dst, weight = graph
            runs: list[dict[str, Any]] = []
            for number in range(repeat):
                row: dict[str, Any] = {"edges": len(src), "nodes": n, "max_size": args.max_size}
                row |= {"run": number + 1, "loadavg_before": _loadavg()}
                row |= bench_hierarchies(n, src, dst, weight, max_size=args.max_size)
                if server_url is not None:
                    url = _fresh_database(server_url)
                    try:
                        row |= asyncio.run(bench_recompute(url, graph, max_size=args.max_size))
                    finally:
                        _drop_database(server_url, url)
                row["loadavg_after"] = _loadavg()
                print(json.dumps(row), flush=True)
                runs.append(row)
            print(json.dumps({"edges": len(src), "median_of": len(runs)} | medians(runs)))
    finally:
        if embedded is not None:
            embedded.stop()
            embedded.purge()


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The median of every timing (``*_s``, stages flattened as ``cold.load_s`` etc.)."""
    values: dict[str, list[float]] = {}
    for run in runs:
        for key, value in run.items():
            if isinstance(value, dict):
                for stage, seconds in value.items():
                    values.setdefault(f"{key.removesuffix('_stages')}.{stage}", []).append(seconds)
            elif key.endswith("_s"):
                values.setdefault(key, []).append(value)
    return {key: round(statistics.median(v), 3) for key, v in values.items()}


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text(encoding="utf-8").split()[:3])


def _drop_database(server_url: str, url: str) -> None:
    import psycopg

    from services.communities.lock import libpq_url

    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}"')


if __name__ == "__main__":
    main()
