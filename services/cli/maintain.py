"""`kgstream maintain`: the graph's periodic upkeep run by hand (the communities worker runs it
on a schedule): consolidation of duplicate entities (services/maintenance/consolidation.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from services.cli.common import group, settings, with_engine

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from services.maintenance.consolidation import Pair, Report

maintain_app = group("The graph's upkeep: consolidation.")


@maintain_app.command("consolidate")
def maintain_consolidate(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what it would merge; make nothing.")
    ] = False,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply/--no-apply",
            help="Also resolve the touched documents again here (else a running indexer does).",
        ),
    ] = False,
    reconsider: Annotated[
        bool,
        typer.Option(
            "--reconsider", help="Ask the adjudicator again about pairs it has answered before."
        ),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(help="Write the uncertain pairs here as review items for a person to judge."),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Look at duplicate candidates again with the context gathered since ingest, and merge the
    ones all evidence agrees on, as curations by "consolidation" (undo them with `kgstream
    curate undo`; an undone one is not proposed again)."""
    from services.core.llm.client import process_client
    from services.core.models import build_context_adjudicator, build_embedder
    from services.maintenance.consolidation import consolidate, review_items

    found = settings()
    client = process_client(found)
    embedder = build_embedder(found, client)
    adjudicate = build_context_adjudicator(found, client)
    shown: list[Pair] = []

    def show(pair: Pair) -> None:
        shown.append(pair)
        if not json_out and pair.decision not in ("uncertain", "apart"):
            typer.echo(
                f"{pair.decision:>9}: {pair.short!r} -> {pair.long!r} (cosine {pair.cosine:.2f},"
                f" shared context {'yes' if pair.shared_context else 'no'}){_note(pair)}"
            )

    async def go(engine: AsyncEngine) -> Report:
        report = await consolidate(
            engine,
            embedder,
            adjudicate=adjudicate,
            dry_run=dry_run,
            reconsider=reconsider,
            on_pair=show,
        )
        if out is not None:
            async with engine.connect() as conn:
                items = await review_items(conn, report.pairs)
            with out.open("w", encoding="utf-8") as fh:
                for i, item in enumerate(items):
                    fh.write(json.dumps({"id": f"consolidate-{i:04d}", **item}) + "\n")
        return report

    report = with_engine(go)
    if json_out:
        typer.echo(
            json.dumps(
                {
                    "dry_run": dry_run,
                    "pairs": [p.as_json() for p in report.pairs],
                    "made": report.made,
                    "refused": report.refused,
                },
                indent=1,
            )
        )
    else:
        counts = {d: sum(p.decision == d for p in report.pairs) for d in _DECISIONS}
        typer.echo(
            f"{len(report.pairs)} candidate pair(s): "
            + ", ".join(f"{n} {d}" for d, n in counts.items())
            + ("" if dry_run else f"; {len(report.made)} curation(s) made")
        )
        for why in report.refused:
            typer.echo(f"refused: {why}")
    if apply and report.made:
        from services.cli.curate import apply_now, print_report

        print_report(apply_now(progress=not json_out))


_DECISIONS = ("adjudicated", "declined", "uncertain", "ambiguous", "ruled", "apart")


def _note(pair: Pair) -> str:
    return f": {pair.note}" if pair.note else ""
