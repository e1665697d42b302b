"""`kgstream curate`: a person's corrections to entity resolution, kept as rules that every later
ingest applies (services/core/curations.py; docs/curation.md, "Curations")."""

from __future__ import annotations

import asyncio
import getpass
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from services.cli.common import fail, group, settings, with_engine

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from services.core.curations import Curation
    from services.indexer.curation_apply import ApplyReport

curate_app = group(
    "Corrections to entity resolution (merge, alias, block, split, rename), kept as rules."
)

Reason = Annotated[str, typer.Option(help="Why (kept with the rule).")]
Apply = Annotated[
    bool,
    typer.Option(
        "--apply/--no-apply",
        help="Resolve the documents it touches again in this process now. Without it a running"
        " indexer does within KGSTREAM_CURATION_APPLY_INTERVAL_S, or `kgstream curate apply`.",
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def actor() -> str:
    """Who made a rule from the command line: the operating-system user."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def _make(kind: str, name: str, other: str, reason: str, apply: bool) -> None:
    from services.core.curations import CurationError, create

    async def go(engine: AsyncEngine) -> tuple[Curation, bool]:
        return await create(engine, kind, name, other, reason=reason, by=actor())

    try:
        made, new = with_engine(go)
    except CurationError as exc:
        raise fail(exc.detail, 2) from None
    typer.echo(made.describe() + ("" if new else " (already in force: nothing made)"))
    if not new:
        return
    if apply:
        print_report(apply_now())
    else:
        typer.echo(
            "pending: a running indexer applies it to the stored documents within"
            " KGSTREAM_CURATION_APPLY_INTERVAL_S; `kgstream curate apply` does it here"
        )


@curate_app.command("merge")
def curate_merge(
    name: Annotated[str, typer.Argument(help="The entity that stays.")],
    other: Annotated[str, typer.Argument(help="The entity merged into it.")],
    reason: Reason = "",
    apply: Apply = False,
) -> None:
    """Merge OTHER into NAME: mentions of OTHER resolve to NAME from now on, in every document."""
    _make("merge", name, other, reason, apply)


@curate_app.command("alias")
def curate_alias(
    name: Annotated[str, typer.Argument(help="The entity.")],
    alias: Annotated[str, typer.Argument(help="Another name of it, seen or not yet.")],
    reason: Reason = "",
    apply: Apply = False,
) -> None:
    """Make ALIAS resolve to NAME (a merge for a name that may not have been seen yet)."""
    _make("alias", name, alias, reason, apply)


@curate_app.command("block")
def curate_block(
    name: Annotated[str, typer.Argument(help="One name.")],
    other: Annotated[str, typer.Argument(help="The other name.")],
    reason: Reason = "",
    apply: Apply = False,
) -> None:
    """Never resolve NAME and OTHER to one entity: not by short form, alias or similarity."""
    _make("block", name, other, reason, apply)


@curate_app.command("split")
def curate_split(
    name: Annotated[str, typer.Argument(help="The entity that was merged wrongly.")],
    alias: Annotated[str, typer.Option("--alias", help="The name to take out of it.")],
    reason: Reason = "",
    apply: Apply = False,
) -> None:
    """Take ALIAS out of NAME, where resolution merged it, and keep the two apart."""
    _make("split", name, alias, reason, apply)


@curate_app.command("rename")
def curate_rename(
    name: Annotated[str, typer.Argument(help="The entity.")],
    new: Annotated[str, typer.Argument(help="The name it shows from now on.")],
    reason: Reason = "",
    apply: Apply = False,
) -> None:
    """Show NAME's entity as NEW; mentions of NEW resolve to it too."""
    _make("rename", name, new, reason, apply)


@curate_app.command("list")
def curate_list(json_out: JsonFlag = False) -> None:
    """Every curation, oldest first, undone ones too, with who made it, when, why and its
    status (pending: the stored documents are not resolved again yet)."""
    from services.core.curations import list_all

    found = with_engine(list_all)
    if json_out:
        typer.echo(json.dumps([c.as_json() for c in found], indent=1))
        return
    if not found:
        typer.echo("no curations")
    for c in found:
        typer.echo(f"{c.describe()} ({c.created_at:%Y-%m-%d %H:%M})")
        if c.undone_at is not None:
            typer.echo(f"    undone by {c.undone_by} {c.undone_at:%Y-%m-%d %H:%M}: {c.undo_reason}")


@curate_app.command("undo")
def curate_undo(
    curation_id: Annotated[int, typer.Argument(help="The curation's id (`curate list`).")],
    reason: Reason = "",
    apply: Apply = False,
) -> None:
    """Take a curation out of force; its documents are resolved again without it."""
    from services.core.curations import CurationError, undo

    async def go(engine: AsyncEngine) -> tuple[Curation, bool]:
        return await undo(engine, curation_id, reason=reason, by=actor())

    try:
        done, changed = with_engine(go)
    except CurationError as exc:
        raise fail(exc.detail, 2) from None
    typer.echo(done.describe() + ("" if changed else " (undone already: nothing changed)"))
    if apply and changed:
        print_report(apply_now())


@curate_app.command("apply")
def curate_apply(json_out: JsonFlag = False) -> None:
    """Resolve the documents of pending (and undone) curations again, in this process, with
    the configured models (an LLM extractor is asked again for each of their chunks)."""
    report = apply_now(progress=not json_out)
    if json_out:
        typer.echo(json.dumps(asdict(report)))
    else:
        print_report(report)
    if report.failed or report.deferred:
        raise typer.Exit(1)


@curate_app.command("export")
def curate_export(
    out: Annotated[Path | None, typer.Option(help="Write here (default: stdout).")] = None,
) -> None:
    """The curations in force as JSON lines, to carry into a database rebuilt from the topic
    (`kgstream curate import`)."""
    from services.core.curations import list_all

    lines = [
        json.dumps({k: v for k, v in c.as_json().items() if k in _PORTABLE})
        for c in with_engine(list_all)
        if c.undone_at is None
    ]
    text = "".join(f"{line}\n" for line in lines)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text, encoding="utf-8")


_PORTABLE = ("kind", "name", "other", "new_name", "reason", "created_by")


@curate_app.command("import")
def curate_import(
    file: Annotated[Path, typer.Argument(help="JSON lines from `kgstream curate export`.")],
) -> None:
    """Make the exported curations here, before the documents arrive (a rebuild): names are
    not checked against the graph, conflicts with rules already here are."""
    from services.core.curations import CurationError, create

    try:
        rows = [
            (n, json.loads(line))
            for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1)
            if line.strip()
        ]
    except (OSError, ValueError) as exc:
        raise fail(f"{file}: {exc}", 2) from None

    async def go(engine: AsyncEngine) -> int:
        for n, row in rows:
            try:
                other = row.get("other", row.get("new_name"))
                await create(
                    engine,
                    str(row["kind"]),
                    str(row["name"]),
                    str(other),
                    reason=str(row.get("reason", "")),
                    by=str(row.get("created_by") or actor()),
                    against_graph=False,
                )
            except (CurationError, KeyError, TypeError) as exc:
                detail = exc.detail if isinstance(exc, CurationError) else f"bad row: {exc}"
                raise fail(f"{file}:{n}: {detail}", 2) from None
        return len(rows)

    typer.echo(f"imported {with_engine(go)} curation(s)")


def apply_now(*, progress: bool = True) -> ApplyReport:
    """Run the apply in this process, with the models the indexer would use."""
    from concurrent.futures import ThreadPoolExecutor

    from services.core.db.engine import DbTimeouts, make_engine
    from services.core.infra.manager import resolve_endpoints
    from services.core.llm.client import process_client
    from services.core.models import build_adjudicator, build_embedder, build_extractor
    from services.indexer.curation_apply import apply_pending
    from services.indexer.deps import IndexerDeps

    found = settings()
    client = process_client(found)

    async def no_dead_letters(_key: bytes | None, _value: bytes) -> None:
        raise RuntimeError("the apply writes no dead letters")

    async def go() -> ApplyReport:
        engine = make_engine(
            resolve_endpoints(found).database_url, timeouts=DbTimeouts.from_settings(found)
        )
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kgstream-cpu")
        try:
            deps = IndexerDeps.from_settings(
                found,
                engine=engine,
                embedder=build_embedder(found, client),
                extractor=build_extractor(found, client),
                executor=pool,
                publish_dead_letter=no_dead_letters,
                adjudicate=build_adjudicator(found, client),
            )
            return await apply_pending(deps, _progress() if progress else None)
        finally:
            pool.shutdown(wait=False)
            await engine.dispose()

    return asyncio.run(go())


def _progress() -> Callable[[int, int], None]:
    """A progress line on stderr: documents resolved again of all."""

    def show(done: int, total: int) -> None:
        end = "\n" if done == total else ""
        sys.stderr.write(f"\rresolving documents again: {done}/{total}{end}")
        sys.stderr.flush()

    return show


def print_report(report: ApplyReport) -> None:
    if report.busy:
        typer.echo("another process is applying curations now; try again when it is done")
        return
    if report.deferred:
        typer.echo(
            f"{report.documents} document(s) resolved again; {report.deferred} failed"
            " transiently and are left for the next run: the rules stay pending (see the log)"
        )
        return
    typer.echo(
        f"applied {report.curations} rule change(s): {report.documents} document(s) resolved"
        f" again, {report.gone} deleted meanwhile, {len(report.failed)} failed"
    )
    for doc_id in report.failed:
        typer.secho(f"  failed: {doc_id} (see the log)", fg=typer.colors.RED, err=True)


__all__ = ["curate_app"]
