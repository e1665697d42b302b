from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.core.settings import Settings


def test_dsn_is_normalised_to_psycopg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KGSTREAM_DATABASE_URL", "postgres://u:p@h:5432/db")
    assert Settings().database_url == "postgresql+psycopg://u:p@h:5432/db"


def test_llm_backends_need_a_base_url() -> None:
    with pytest.raises(ValidationError, match="KGSTREAM_OPENAI_BASE_URL"):
        Settings(extractor_backend="openai")


def test_overlap_must_be_smaller_than_chunk() -> None:
    with pytest.raises(ValidationError, match="chunk_overlap"):
        Settings(chunk_tokens=50, chunk_overlap=50)
