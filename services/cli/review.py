"""`kgstream review`: the seed's weekly sample of entity links for a person to judge, and the
graph's linking figures against judged samples (services/maintenance/review.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from services.cli.common import fail, group, with_engine

review_app = group("Entity links for a person to judge, and the figures they give.")


@review_app.command("sample")
def review_sample(
    n: Annotated[int, typer.Argument(min=1, max=10_000, help="Items to draw in all.")] = 100,
    merged_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of merges among the items.")
    ] = 0.5,
    seed: Annotated[int | None, typer.Option(help="Seed of the draw (default: random).")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Write the items as JSON lines here (then judge them).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the items as JSON.")] = False,
) -> None:
    """Draw merges and pairs kept apart, with their sentences, for a person to judge.

    Judge each item by adding "label": "same" | "different" | "unsure" to its line, then run
    `kgstream review score FILE`."""
    from services.maintenance.review import sample

    merges = round(n * merged_share)

    async def draw(engine: Any) -> list[dict[str, Any]]:
        async with engine.connect() as conn:
            return await sample(conn, candidates=n - merges, merges=merges, seed=seed)

    items = with_engine(draw)
    for i, item in enumerate(items):
        item["id"] = f"review-{i:04d}"
    if out is not None:
        with out.open("w", encoding="utf-8") as fh:
            for item in items:
                fh.write(json.dumps(item, ensure_ascii=False) + "\n")
    if json_out:
        typer.echo(json.dumps(items, ensure_ascii=False, indent=1))
        return
    for item in items:
        a, b = item["a"], item["b"]
        question = "merged: right?" if item["kind"] == "merged" else "kept apart: one thing?"
        typer.echo(f"{item['id']} {question}")
        for side in (a, b):
            first = side["contexts"][0]
            typer.echo(f'  {side["entity"]} ({side["type"]}) as "{first["surface"]}" in')
            typer.echo(f"    [{first['title']}] {first['sentence']}")
    where = f"; written to {out}" if out is not None else ""
    typer.echo(f"{len(items)} item(s){where}")


@review_app.command("score")
def review_score(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The graph's duplicate and false-merge rates against judged items."""
    from services.maintenance.review import score

    items = [item for _, item in _judged(file)]

    async def measure(engine: Any) -> dict[str, Any]:
        async with engine.connect() as conn:
            return await score(conn, items)

    report = with_engine(measure)
    if json_out:
        typer.echo(json.dumps(report, indent=1))
        return
    _print_rates(report)


def _judged(file: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, item) of every judged item; exits 2 naming the first bad line."""
    from services.maintenance.review import check_item

    items = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            check_item(item)
        except (ValueError, AttributeError) as exc:
            raise fail(f"{file}:{number}: {exc}", 2) from exc
        items.append((number, item))
    return items


def _print_rates(report: dict[str, Any]) -> None:
    for name in (
        "linking_accuracy",
        "duplicate_rate",
        "false_merge_rate",
        "merges_made_of_distinct_pairs",
    ):
        r = report[name]
        share = "-" if r["share"] is None else f"{100 * r['share']:.1f}%"
        low, high = r["ci95"]
        typer.echo(
            f"{name.replace('_', ' ')}: {share} ({r['hits']} of {r['of']};"
            f" 95% CI {100 * low:.1f}-{100 * high:.1f}%)"
        )
    missing = sum(c["missing"] for c in report["counts"].values())
    if missing:
        typer.echo(f"{missing} item(s) whose mentions are gone (documents deleted) left out")


@review_app.command("apply")
def review_apply(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what it would make; make nothing.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Turn judged items into curations, and print the linking figures they measure.

    A pair judged the same that the graph keeps apart becomes a merge; one judged different
    that it merged, a split; one judged different and kept apart, a block. The curations are
    pending until an indexer (or `kgstream curate apply`) resolves their documents again."""
    from services.cli.curate import actor
    from services.maintenance.review import apply_verdicts

    judged = _judged(file)

    async def go(engine: Any) -> dict[str, Any]:
        return await apply_verdicts(engine, judged, by=actor(), source=file.name, dry_run=dry_run)

    result = with_engine(go)
    if json_out:
        typer.echo(json.dumps(result, indent=1))
        return
    _print_rates(result["figures"])
    for row in result["curations"]:
        if row["kind"] is not None:
            typer.echo(
                f"line {row['line']}: {row['kind']} {row['name']!r} / {row['other']!r}:"
                f" {row['result']}"
            )
    todo = sum(r["kind"] is not None for r in result["curations"])
    typer.echo(
        f"{todo} curation(s) {'proposed' if dry_run else 'asked for'};"
        f" {len(result['curations']) - todo} item(s) need none"
    )
