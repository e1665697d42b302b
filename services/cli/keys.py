"""`kgstream keys`: the query API's keys, created, listed and revoked."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from services.cli.common import JsonFlag, group
from services.cli.common import fail as _fail
from services.cli.common import with_engine as _with_engine

keys_app = group("API keys of the query API.")


@keys_app.command("create")
def keys_create(
    scopes: Annotated[str, typer.Option(help="Comma-separated: query, ingest, admin.")],
    tenant: Annotated[str | None, typer.Option(help="Tenant the key's caller belongs to.")] = None,
    groups: Annotated[str, typer.Option(help="Comma-separated ACL groups of the caller.")] = "",
    name: Annotated[str, typer.Option(help="A label for operators.")] = "",
) -> None:
    """Create a key. Its plaintext is printed once, alone on the last line of stdout."""
    from services.core.api_keys import ApiKeyError, create_key, parse_scopes

    try:
        chosen = parse_scopes(scopes)
    except ApiKeyError as exc:
        raise _fail(str(exc), 2) from exc
    key, plaintext = _with_engine(
        lambda engine: create_key(
            engine, chosen, tenant=tenant, groups=groups.split(","), name=name
        )
    )
    typer.echo(
        f"created API key {key.id} (lookup id {key.lookup_id}) scopes={','.join(key.scopes)}"
        f" tenant={key.tenant or '-'} groups={','.join(key.groups) or '-'}"
    )
    typer.echo("store it now: it is not shown again")
    typer.echo(plaintext)


@keys_app.command("list")
def keys_list(json_out: JsonFlag = False) -> None:
    """Every key with its scopes, tenant, groups and state (never the secret)."""
    from services.core.api_keys import list_keys

    keys = _with_engine(list_keys)
    if json_out:
        typer.echo(json.dumps([k.to_dict() for k in keys], indent=2))
        return
    for k in keys:
        state = f"revoked {k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "active"
        used = f"{k.last_used_at:%Y-%m-%d %H:%M}" if k.last_used_at else "never"
        typer.echo(
            f"#{k.id} {k.lookup_id} {k.name or '-'} scopes={','.join(k.scopes)}"
            f" tenant={k.tenant or '-'} groups={','.join(k.groups) or '-'} {state} used={used}"
        )
    typer.echo(f"{len(keys)} key(s)")


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[int, typer.Argument(help="The key's id (`keys list`).")]) -> None:
    """Revoke a key; API processes stop accepting it within KGSTREAM_AUTH_CACHE_TTL_S."""
    from services.core.api_keys import ApiKeyError, revoke_key

    try:
        key = _with_engine(lambda engine: revoke_key(engine, key_id))
    except ApiKeyError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"revoked API key {key.id} ({key.lookup_id}) at {key.revoked_at:%Y-%m-%d %H:%M:%S}")
