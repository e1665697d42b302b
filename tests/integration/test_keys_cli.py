"""`kgstream keys create|list|revoke` as a user runs them, the query API refusing to start
without keys on a public address, `kgstream query` sending KGSTREAM_API_KEY to a real server,
and migrations 0003 and 0004 going down and up again."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from pydantic import SecretStr
from sqlalchemy import create_engine, inspect

from alembic import command
from services.cli.query import ApiError, run_query
from services.core.api_keys import verify_key
from services.core.db.engine import make_engine
from services.core.db.migrations import alembic_config
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.infra.manager import Endpoints
from services.core.infra.ports import free_port
from services.core.settings import Settings
from services.query_api.app import create_app
from services.retrieval.schemas import QueryRequest
from services.retrieval.service import build_query_service
from tests.support.cli import env_for, kgstream
from tests.support.server import serving

pytestmark = pytest.mark.integration
KEY = re.compile(r"kgs_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")


async def test_create_list_revoke(settings: Settings) -> None:
    created = kgstream(
        settings, "keys", "create", "--scopes", "query,ingest", "--tenant", "acme",
        "--groups", "hr,eng", "--name", "ci",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    *info, last = created.stdout.strip().splitlines()
    assert KEY.fullmatch(last), created.stdout
    assert not any(last in line for line in info)
    assert "scopes=query,ingest tenant=acme groups=eng,hr" in info[0]

    assert settings.database_url is not None
    engine = make_engine(settings.database_url)
    key = await verify_key(engine, last)
    assert key is not None
    assert (key.tenant, key.groups, key.name) == ("acme", ("eng", "hr"), "ci")
    assert key.scopes == ("query", "ingest")

    admin = kgstream(settings, "keys", "create", "--scopes", "admin")
    assert admin.returncode == 0, admin.stderr
    listed = kgstream(settings, "keys", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["scopes"] for r in rows] == [["query", "ingest"], ["admin"]]
    assert rows[0]["revoked_at"] is None
    assert rows[0]["last_used_at"] is not None
    plain = kgstream(settings, "keys", "list")
    for output in (listed.stdout, plain.stdout):
        assert last not in output
        assert last[17:] not in output
        assert not KEY.search(output)
    assert "2 key(s)" in plain.stdout

    revoked = kgstream(settings, "keys", "revoke", str(rows[0]["id"]))
    assert revoked.returncode == 0, revoked.stderr
    assert f"revoked API key {rows[0]['id']}" in revoked.stdout
    assert await verify_key(engine, last) is None
    assert json.loads(kgstream(settings, "keys", "list", "--json").stdout)[0]["revoked_at"]
    await engine.dispose()

    unknown = kgstream(settings, "keys", "revoke", "999")
    assert unknown.returncode == 1
    assert "no API key has id 999" in unknown.stderr
    bad = kgstream(settings, "keys", "create", "--scopes", "query,write")
    assert bad.returncode == 2
    assert "unknown scope(s) ['write']: choose from query, ingest, admin" in bad.stderr
    assert bad.stdout == ""


def test_query_api_refuses_to_start_on_a_public_address_without_auth(settings: Settings) -> None:
    env = {**env_for(settings), "KGSTREAM_API_HOST": "0.0.0.0", "KGSTREAM_AUTH": "off"}  # noqa: S104
    run = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "worker", "query-api"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 1, run.stderr
    assert "refusing to start the query API on 0.0.0.0 with KGSTREAM_AUTH=off" in run.stderr
    assert "KGSTREAM_AUTH_ALLOW_INSECURE=true" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.fixture
def served(
    settings: Settings,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> Iterator[Settings]:
    """A real query API (uvicorn, in a thread) on a free loopback port with keys required."""
    assert settings.database_url is not None
    api = settings.model_copy(update={"api_port": free_port(), "auth": "required"})
    service = build_query_service(
        api, make_engine(settings.database_url), embedder, extractor, cpu_pool
    )
    app = create_app(
        api,
        Endpoints(settings.database_url, str(settings.kafka_bootstrap_servers)),
        service=service,
    )
    with serving(app, api.api_port):
        yield api


def test_kgstream_query_sends_the_configured_key(served: Settings) -> None:
    created = kgstream(served, "keys", "create", "--scopes", "query")
    key = created.stdout.strip().splitlines()[-1]
    req = QueryRequest(question="Who directed the film?", mode="vector", k=2)
    with pytest.raises(ApiError, match=r"401.*set KGSTREAM_API_KEY"):
        run_query(served, req)
    resp, via = run_query(served.model_copy(update={"api_key": SecretStr(key)}), req)
    assert via == "api"
    assert resp.mode_used == "vector"


def test_migrations_0003_and_0004_go_down_and_up(database_url: str) -> None:
    cfg = alembic_config(database_url, 384)
    engine = create_engine(database_url)

    def state() -> tuple[bool, bool]:
        found = inspect(engine)
        published = "published_at" in {c["name"] for c in found.get_columns("dead_letters")}
        return "api_keys" in found.get_table_names(), published

    try:
        assert state() == (True, True)
        command.downgrade(cfg, "0003")
        assert state() == (False, True)
        command.downgrade(cfg, "0002")
        assert state() == (False, False)
        command.upgrade(cfg, "head")
        assert state() == (True, True)
    finally:
        engine.dispose()
