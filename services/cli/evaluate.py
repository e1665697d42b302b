"""`kgstream eval` output: the per-mode tables for people (JSON is printed by the command)."""

from __future__ import annotations

from typing import Any

COLUMNS = ("recall", "all_gold", "mrr", "p50_ms", "p99_ms", "n")


def table(report: dict[str, Any]) -> str:
    """One row per mode and question type."""
    k = report["k"]
    head = f"{'mode':<8} {'type':<11} {'R@' + str(k):>6} {'all@' + str(k):>7} {'MRR':>6}"
    lines = [head + f" {'p50 ms':>8} {'p99 ms':>8} {'n':>4}"]
    for mode, rep in report["modes"].items():
        if "unavailable" in rep:
            lines.append(f"{mode:<8} unavailable: {rep['unavailable']}")
            continue
        rows = [("overall", rep["overall"]), *rep["by_type"].items()]
        for kind, m in rows:
            lines.append(
                f"{mode:<8} {kind:<11} {m['recall']:>6.3f} {m['all_gold']:>7.3f} {m['mrr']:>6.3f}"
                f" {m['p50_ms']:>8.1f} {m['p99_ms']:>8.1f} {m['n']:>4}"
            )
    return "\n".join(lines)
