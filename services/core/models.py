"""Builds the configured embedder and extractor (offline defaults or OpenAI-compatible)."""

from __future__ import annotations

from services.core.embedding import Embedder, OnnxMiniLmEmbedder, OpenAIEmbedder
from services.core.errors import ConfigurationError
from services.core.extraction import Extractor, SpacyExtractor
from services.core.settings import Settings


def build_embedder(settings: Settings) -> Embedder:
    """The embedder the settings name; its width must match KGSTREAM_EMBEDDING_DIM."""
    if settings.embedding_backend == "openai":
        import openai

        client = openai.OpenAI(
            base_url=settings.openai_base_url, api_key=settings.openai_api_key.get_secret_value()
        )
        embedder: Embedder = OpenAIEmbedder(
            client, settings.embedding_model, settings.embedding_dim
        )
    else:
        embedder = OnnxMiniLmEmbedder(batch_size=settings.embed_batch_size)
    if embedder.dim != settings.embedding_dim:
        raise ConfigurationError(
            f"{embedder.model_id} makes {embedder.dim}-d vectors but KGSTREAM_EMBEDDING_DIM is "
            f"{settings.embedding_dim}"
        )
    return embedder


def build_extractor(settings: Settings) -> Extractor:
    """The extractor the settings name."""
    if settings.extractor_backend == "openai":
        from services.core.llm import OpenAIExtractor, make_openai_client

        return OpenAIExtractor(
            make_openai_client(settings),
            settings.llm_model,
            max_attempts=settings.llm_max_attempts,
            concurrency=settings.llm_concurrency,
            gleanings=settings.extraction_gleanings,
        )
    return SpacyExtractor()
