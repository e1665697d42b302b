"""What local mode's chains cost (issue 19, deliverable 4): runs `kgstream eval --modes local`
on a kept database once with chains off and once on, and times each part of every chain step
(the links statement, the question terms and title statements, the relevance (fused dense and
graph scores over the grown pool), the beam step itself).

    .venv/bin/python bench/chain_steps.py --events E.jsonl --questions Q.jsonl --keep DIR

Prints local p50 / p99 without and with chains, the steps per question, the mean cost of each
part per question and of a whole step, as JSON lines. Timing wrappers are installed on the
module functions follow_chains calls (counting only while it runs), so the figures include
their awaits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.core.settings import Settings  # noqa: E402
from services.eval.runner import EvalConfig, evaluate  # noqa: E402
from services.retrieval import chain_search, chains  # noqa: E402

INSIDE: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "inside", default=None
)
PER_QUERY: list[dict[str, float]] = []


def timed_async(name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        acc = INSIDE.get()
        start = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            if acc is not None:
                acc[name] = acc.get(name, 0.0) + (time.perf_counter() - start) * 1000

    return wrapper


def timed_step(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        acc = INSIDE.get()
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if acc is not None:
                acc["beam step"] = acc.get("beam step", 0.0) + (time.perf_counter() - start) * 1000
                acc["steps"] = acc.get("steps", 0.0) + 1

    return wrapper


def install() -> None:
    follow = chain_search.follow_chains

    async def follow_chains(*args: Any, **kwargs: Any) -> tuple[list[int], tuple[int, ...]]:
        acc: dict[str, float] = {}
        token = INSIDE.set(acc)
        start = time.perf_counter()
        try:
            return await follow(*args, **kwargs)
        finally:
            acc["total"] = (time.perf_counter() - start) * 1000
            INSIDE.reset(token)
            PER_QUERY.append(acc)

    chain_search.follow_chains = follow_chains
    parts = {"bridge_step": "links", "question_terms": "terms", "question_lexemes": "lexemes"}
    parts["_about"] = "titles"
    for name, label in parts.items():
        setattr(chain_search, name, timed_async(label, getattr(chain_search, name)))
    chains.step = timed_step(chains.step)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(p / 100 * len(ordered)) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--questions", type=Path, required=True)
    parser.add_argument("--keep", type=Path, required=True)
    args = parser.parse_args()
    install()
    for width in (0, Settings().query_local_chain_width):
        settings = Settings(query_local_chain_width=width)
        config = EvalConfig(args.events, args.questions, modes=["local"], keep=args.keep)
        PER_QUERY.clear()
        outcome = asyncio.run(evaluate(settings, config))
        overall = outcome.modes["local"]["overall"]
        row: dict[str, Any] = {
            "chain_width": width,
            "local_p50_ms": overall["p50_ms"],
            "local_p99_ms": overall["p99_ms"],
            "all_gold": overall["all_gold"],
        }
        if PER_QUERY:
            steps = sum(q.get("steps", 0.0) for q in PER_QUERY)
            parts: dict[str, float] = defaultdict(float)
            for q in PER_QUERY:
                for name, ms in q.items():
                    if name not in ("steps", "total"):
                        parts[name] += ms
            totals = [q["total"] for q in PER_QUERY]
            # the relevance callback (fused dense and graph scores) is what the wrappers miss
            parts["relevance"] = sum(totals) - sum(parts.values())
            n = len(PER_QUERY)
            row |= {
                "queries_with_chains": n,
                "steps_per_query": round(steps / n, 2),
                "chain_ms_p50": round(percentile(totals, 50), 1),
                "chain_ms_p99": round(percentile(totals, 99), 1),
                "ms_per_query": {k: round(v / n, 2) for k, v in sorted(parts.items())},
                "ms_per_step": round(sum(totals) / max(steps, 1), 2),
            }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
