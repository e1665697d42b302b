"""Local-mode knobs measured on an already indexed database: graph ranker (PPR or the path
formula) and fusion weights (vector / lexical / graph), plus dense-only and hybrid vector.

    .venv/bin/python bench/sweep_query.py DATABASE_URL [QUESTIONS.jsonl] [--k 10]

Index the corpus first (e.g. `bench/bench_query.py --database-url URL --modes vector`).
Prints one JSON line per configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.core.db.engine import UNBOUNDED, make_engine  # noqa: E402
from services.core.embedding import OnnxMiniLmEmbedder  # noqa: E402
from services.core.extraction import SpacyExtractor  # noqa: E402
from services.eval.metrics import mode_report  # noqa: E402
from services.eval.runner import load_jsonl, run_questions  # noqa: E402
from services.retrieval.local import LocalWeights  # noqa: E402
from services.retrieval.service import QueryConfig, QueryService  # noqa: E402

QUESTIONS = ROOT.parent / "shared" / "data" / "hotpotqa-train100" / "questions.jsonl"
# (mode, config overrides, (vector, lexical, graph) weights)
GRID: list[tuple[str, dict[str, Any], tuple[float, float, float]]] = [
    ("vector", {"hybrid": False}, (0.3, 0.3, 0.4)),
    ("vector", {"hybrid": True}, (0.3, 0.3, 0.4)),
    ("local", {"local_ranker": "ppr"}, (0.5, 0.0, 0.5)),
    ("local", {"local_ranker": "ppr"}, (0.3, 0.0, 0.7)),
    ("local", {"local_ranker": "ppr"}, (0.4, 0.2, 0.4)),
    ("local", {"local_ranker": "ppr"}, (0.3, 0.3, 0.4)),
    ("local", {"local_ranker": "ppr"}, (0.25, 0.25, 0.5)),
    ("local", {"local_ranker": "paths"}, (0.5, 0.0, 0.5)),
    ("local", {"local_ranker": "paths"}, (0.3, 0.0, 0.7)),
    ("local", {"local_ranker": "paths"}, (0.3, 0.3, 0.4)),
]


async def sweep(database_url: str, questions_path: Path, k: int) -> None:
    engine = make_engine(database_url, timeouts=UNBOUNDED)
    with ThreadPoolExecutor(max_workers=2) as pool:
        base = QueryService(engine, OnnxMiniLmEmbedder(), SpacyExtractor(), pool)
        questions = load_jsonl(questions_path)
        for mode, overrides, weights in GRID:
            config = QueryConfig(**overrides, local_weights=LocalWeights(*weights))
            service = dataclasses.replace(base, config=config)
            report = mode_report(await run_questions(service, questions, mode, k, False), k)
            label = {"mode": mode, **overrides}
            if mode == "local":
                label["weights"] = weights
            print(json.dumps({**label, **report}), flush=True)
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("database_url")
    parser.add_argument("questions", type=Path, nargs="?", default=QUESTIONS)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(sweep(args.database_url, args.questions, args.k))


if __name__ == "__main__":
    main()
