"""`kgstream infra` (the embedded PostgreSQL and broker) and `kgstream db` (the schema)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from services.cli.common import JsonFlag, group
from services.cli.common import settings as _settings

infra_app = group("Embedded PostgreSQL and Kafka broker.")
db_app = group("Database schema.")


@infra_app.command("up")
def infra_up_cmd(json_out: JsonFlag = False) -> None:
    """Start the embedded PostgreSQL and broker (only what is not configured)."""
    from services.core.infra.manager import infra_up

    state = infra_up(_settings())
    _print_state(state.to_dict(), json_out)


@infra_app.command("down")
def infra_down_cmd(
    purge: Annotated[
        bool, typer.Option("--purge", help="Also delete the embedded database's data.")
    ] = False,
) -> None:
    """Stop what `infra up` started (data is kept unless --purge)."""
    from services.core.infra.manager import infra_down
    from services.core.infra.postgres import EmbeddedPostgres

    settings = _settings()
    infra_down(settings)
    if purge and settings.database_url is None:
        EmbeddedPostgres.from_settings(settings).purge()
        typer.echo("stopped; embedded database data deleted")
        return
    typer.echo("stopped")


@infra_app.command("status")
def infra_status_cmd(json_out: JsonFlag = False) -> None:
    """What runs where."""
    from services.core.infra.manager import infra_status

    _print_state(infra_status(_settings()).to_dict(), json_out)


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply the migrations (and record the embedding width)."""
    from services.core.db import migrations
    from services.core.infra.manager import resolve_endpoints

    settings = _settings()
    migrations.upgrade(resolve_endpoints(settings).database_url, settings.embedding_dim, revision)
    typer.echo(f"database at {revision}")


def _print_state(state: dict[str, Any], json_out: bool) -> None:
    if json_out:
        typer.echo(json.dumps(state, indent=2))
        return
    for key, value in state.items():
        typer.echo(f"{key}: {value}")
