"""The one settings model. Read in entrypoints (``Settings()``), never at import time."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """kgstream configuration; every field is settable as ``KGSTREAM_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="KGSTREAM_", extra="ignore")

    # --- infrastructure -------------------------------------------------
    home: Path = Field(
        default=Path(".kgstream"),
        description="State directory: embedded server data, pid files, the infra state file.",
    )
    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL. Unset: the embedded PostgreSQL under `home` is used.",
    )
    kafka_bootstrap_servers: str | None = Field(
        default=None,
        description="Kafka bootstrap servers (host:port,...). Unset: the embedded tansu broker.",
    )
    embedded_user: str = Field(
        default="nobody",
        description="Unprivileged user that runs the embedded PostgreSQL when invoked as root.",
    )

    # --- topics ---------------------------------------------------------
    documents_topic: str = Field(default="kgstream.documents", description="Document events.")
    dlq_topic: str = Field(default="kgstream.documents.dlq", description="Dead letters.")
    snapshots_topic: str = Field(default="kgstream.snapshots", description="Snapshot events.")
    topic_partitions: int = Field(default=4, ge=1, description="Partitions when we create topics.")
    consumer_group: str = Field(default="kgstream-indexer", description="Indexer consumer group.")
    broker_session_timeout_s: float = Field(
        default=6.0, description="Consumer session timeout (tansu: joins take half of it)."
    )
    broker_heartbeat_interval_s: float = Field(default=1.5, description="Consumer heartbeat.")
    broker_commit_interval_s: float = Field(
        default=0.5, description="Offset commit interval: bounds redelivery after a crash."
    )

    # --- indexing -------------------------------------------------------
    embedding_dim: int = Field(
        default=384, ge=8, le=4096, description="Vector width; recorded in the database."
    )
    embedding_backend: Literal["onnx-minilm", "openai"] = Field(
        default="onnx-minilm", description="Offline ONNX MiniLM, or an OpenAI-compatible endpoint."
    )
    extractor_backend: Literal["spacy", "openai"] = Field(
        default="spacy", description="Offline spaCy NER + dependency relations, or an LLM."
    )
    chunk_tokens: int = Field(
        default=180, ge=16, description="Chunk size in cl100k tokens (fits MiniLM's 256 pieces)."
    )
    chunk_overlap: int = Field(default=30, ge=0, description="Token overlap between chunks.")
    embed_batch_size: int = Field(default=16, ge=1, description="Passages per embedding call.")
    max_document_bytes: int = Field(
        default=2_000_000, ge=1, description="Larger documents are dead-lettered."
    )

    # --- LLM (optional) -------------------------------------------------
    openai_base_url: str | None = Field(
        default=None, description="OpenAI-compatible base URL; unset means offline defaults."
    )
    openai_api_key: SecretStr = Field(default=SecretStr("unused"), description="API key.")
    llm_model: str = Field(default="gpt-4o-mini", description="Chat model for extraction/reports.")
    embedding_model: str = Field(
        default="text-embedding-3-small", description="Embedding model when backend=openai."
    )

    # --- communities ----------------------------------------------------
    recompute_threshold: float = Field(
        default=0.10, gt=0, le=1, description="Change ratio above which communities recompute."
    )

    # --- query API ------------------------------------------------------
    api_host: str = Field(default="127.0.0.1", description="Query API bind address.")
    api_port: int = Field(default=8000, ge=0, le=65535, description="Query API port.")

    log_level: str = Field(default="INFO", description="Python log level.")

    @field_validator("database_url")
    @classmethod
    def _normalise_dsn(cls, value: str | None) -> str | None:
        """Accept postgres:// and postgresql:// and always hand SQLAlchemy psycopg 3."""
        if value is None or value == "":
            return None
        for prefix in ("postgres://", "postgresql://", "postgresql+psycopg2://"):
            if value.startswith(prefix):
                return "postgresql+psycopg://" + value[len(prefix) :]
        return value

    @field_validator("kafka_bootstrap_servers")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        return value or None

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.chunk_overlap >= self.chunk_tokens:
            raise ValueError("chunk_overlap must be smaller than chunk_tokens")
        if self.embedding_backend == "openai" and not self.openai_base_url:
            raise ValueError("embedding_backend=openai needs KGSTREAM_OPENAI_BASE_URL")
        if self.extractor_backend == "openai" and not self.openai_base_url:
            raise ValueError("extractor_backend=openai needs KGSTREAM_OPENAI_BASE_URL")
        return self

    @property
    def home_dir(self) -> Path:
        return self.home.expanduser().resolve()
