"""Does retrieval hold as the corpus grows? musique-kag100's questions over its own passages, then
over those plus hotpotqa-train100's 994 and wiki2-distractors' 6,118 (8,951 in all), by hop
count: all-gold@k, R@5, MRR and the relative loss (issue 32, step 6; docs/retrieval.md,
"Quality as the corpus grows").

    .venv/bin/python bench/grown_pool.py --keep-root /var/tmp/kg-grown [--data ../shared/data]
        [--modes vector,local] [--out docs-figures.json]

Each pool is ingested once into an embedded PostgreSQL kept under --keep-root (the grown one
takes ~11 minutes on 2 cores; later runs reuse it and take seconds), through `kgstream eval`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OWN = "musique-kag100/events.jsonl"
GROWN = (OWN, "hotpotqa-train100/events_full.jsonl", "wiki2-distractors/events.jsonl")
QUESTIONS = "musique-kag100/questions.jsonl"


def evaluate(data: Path, events: Path, keep: Path, modes: str, details: Path) -> None:
    """``kgstream eval`` of musique-kag100's questions over these events, details kept."""
    subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "kgstream"),
            "eval",
            "--events",
            str(events),
            "--questions",
            str(data / QUESTIONS),
            "--modes",
            modes,
            "--keep",
            str(keep),
            "--details",
            str(details),
            "--json",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def by_hops(details: Path) -> dict[str, dict[str, dict[str, float]]]:
    """mode -> hop count ("all" too) -> all-gold, R@5, MRR and n, from the details file."""
    rows = [json.loads(line) for line in details.read_text().splitlines() if line]
    out: dict[str, dict[str, dict[str, float]]] = {}
    for mode in sorted({r["mode"] for r in rows}):
        mine = [r for r in rows if r["mode"] == mode]
        groups: dict[str, list[dict[str, Any]]] = {"all": mine}
        for r in mine:
            groups.setdefault(str(r["hops"]), []).append(r)
        out[mode] = {hops: figures(group) for hops, group in sorted(groups.items())}
    return out


def figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    """all-gold, R@5 and MRR over these questions' rows."""

    def recall5(r: dict[str, Any]) -> float:
        gold = set(r["gold_doc_ids"])
        return len(gold & set(r["ranked_doc_ids"][:5])) / len(gold)

    def reciprocal(r: dict[str, Any]) -> float:
        gold = set(r["gold_doc_ids"])
        return next((1 / (i + 1) for i, d in enumerate(r["ranked_doc_ids"]) if d in gold), 0.0)

    n = len(rows)
    return {
        "n": n,
        "all_gold": round(sum(r["all_gold"] for r in rows) / n, 3),
        "recall_at_5": round(sum(map(recall5, rows)) / n, 3),
        "mrr": round(sum(map(reciprocal, rows)) / n, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--keep-root", type=Path, required=True, help="e.g. /var/tmp/kg-grown")
    parser.add_argument("--modes", default="vector,local")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not (args.data / QUESTIONS).exists():
        sys.exit(f"{args.data / QUESTIONS} not found: pass --data (the shared datasets)")
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        grown = Path(tmp) / "grown.jsonl"
        with grown.open("w") as out:
            for part in GROWN:
                out.write((args.data / part).read_text())
        for name, events in (("own", args.data / OWN), ("grown", grown)):
            details = Path(tmp) / f"{name}.jsonl"
            evaluate(args.data, events, args.keep_root / name, args.modes, details)
            report[name] = by_hops(details)
    report["relative_loss"] = {
        mode: {
            hops: round(1 - report["grown"][mode][hops]["all_gold"] / own["all_gold"], 3)
            for hops, own in groups.items()
            if own["all_gold"] > 0
        }
        for mode, groups in report["own"].items()
    }
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
