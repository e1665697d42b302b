"""Each composition root builds one OpenAI client and hands it to every model user (issue 8:
one retry policy, one connection pool per process). Nothing here connects anywhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

from services.communities.app import build_deps
from services.core.infra.manager import Endpoints
from services.core.settings import Settings
from services.indexer.app import create_app as create_indexer
from services.retrieval.compose import build_service

DB = "postgresql+psycopg://kg@127.0.0.1:1/kg"
LLM = Settings(
    openai_base_url="http://127.0.0.1:1/v1",
    embedding_backend="openai",
    extractor_backend="openai",
    community_reports="llm",
    embedding_dim=384,
)


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> list[openai.OpenAI]:
    made: list[openai.OpenAI] = []
    real_init = openai.OpenAI.__init__

    def counting(self: openai.OpenAI, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(openai.OpenAI, "__init__", counting)
    return made


@pytest.mark.parametrize(
    "build",
    [
        lambda: build_service(LLM, DB),
        lambda: build_deps(LLM, DB),
        lambda: create_indexer(LLM, Endpoints(DB, "127.0.0.1:1")),
    ],
    ids=["query-api", "communities", "indexer"],
)
def test_one_client_per_process(clients: list[openai.OpenAI], build: Callable[[], Any]) -> None:
    build()
    assert len(clients) == 1


def test_offline_builds_no_client(clients: list[openai.OpenAI]) -> None:
    build_deps(Settings(), DB)
    assert clients == []
