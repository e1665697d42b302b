"""What MCP costs over the HTTP API: the same questions asked as POST /v1/query and as the MCP
`answer` tool (the same work: retrieval and the offline answer; the official SDK's client,
streamable HTTP at /mcp), one at a time, on a kept eval database (issue 22).

    .venv/bin/kgstream eval --events services/cli/sample/events.jsonl \\
        --questions services/cli/sample/questions.jsonl --modes vector --keep /tmp/mcp-db
    .venv/bin/python bench/bench_mcp.py --keep /tmp/mcp-db [--questions Q.jsonl] [--n 40]
        [--modes vector,local]

Starts the kept embedded PostgreSQL and a query API process on it (keys off: loopback), warms
both paths with a few questions, then asks each question by both paths in turn (alternating
which goes first) and prints the latency percentiles per mode and path, and the MCP overhead
(the median of the per-question differences). `search`, which skips the answer step, is
cheaper still by that step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx
import httpx2
from _query_api import ROOT, kept_query_api, quantile
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

QUESTIONS = ROOT / "services" / "cli" / "sample" / "questions.jsonl"
WARM = 5


async def measure(base: str, questions: list[str], modes: list[str]) -> dict[str, object]:
    report: dict[str, object] = {}
    async with (
        httpx.AsyncClient(base_url=base, timeout=120) as http,
        httpx2.AsyncClient(timeout=120) as transport_client,
        Client(streamable_http_client(f"{base}/mcp", http_client=transport_client)) as mcp,
    ):

        async def via_http(question: str, mode: str) -> float:
            start = time.perf_counter()
            resp = await http.post("/v1/query", json={"question": question, "mode": mode, "k": 10})
            resp.raise_for_status()
            return time.perf_counter() - start

        async def via_mcp(question: str, mode: str) -> float:
            start = time.perf_counter()
            result = await mcp.call_tool("answer", {"question": question, "mode": mode, "k": 10})
            if result.is_error:
                raise SystemExit(f"MCP answer failed: {result.content}")
            return time.perf_counter() - start

        for mode in modes:
            for question in questions[:WARM]:
                await via_http(question, mode)
                await via_mcp(question, mode)
            took: dict[str, list[float]] = {"http": [], "mcp": []}
            for i, question in enumerate(questions):
                order = [("http", via_http), ("mcp", via_mcp)]
                for name, call in order if i % 2 == 0 else order[::-1]:
                    took[name].append(await call(question, mode))
            diffs = [m - h for h, m in zip(took["http"], took["mcp"], strict=True)]
            report[mode] = {
                **{
                    path: {
                        "p50_ms": round(1000 * quantile(values, 0.5), 1),
                        "p95_ms": round(1000 * quantile(values, 0.95), 1),
                    }
                    for path, values in took.items()
                },
                "mcp_overhead_median_ms": round(1000 * statistics.median(diffs), 1),
                "n": len(questions),
            }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, required=True, help="a `kgstream eval --keep` home")
    parser.add_argument("--questions", type=Path, default=QUESTIONS)
    parser.add_argument("--n", type=int, default=40, help="questions per mode")
    parser.add_argument("--modes", default="vector,local")
    args = parser.parse_args()
    lines = args.questions.read_text(encoding="utf-8").splitlines()
    questions = [json.loads(line)["question"] for line in lines if line.strip()][: args.n]
    with kept_query_api(args.keep) as base:
        report = asyncio.run(measure(base, questions, args.modes.split(",")))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
