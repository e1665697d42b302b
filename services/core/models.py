"""Builds the configured embedder and extractor (offline defaults or OpenAI-compatible) around
the process's one OpenAI client, which the composition root makes and passes in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import openai

from services.core.cpu_budget import cpu_threads
from services.core.embedding import Embedder, OnnxMiniLmEmbedder, OpenAIEmbedder
from services.core.errors import ConfigurationError
from services.core.extraction import Extractor, SpacyExtractor
from services.core.model_meter import NO_METER, ModelMeter
from services.core.settings import Settings


def build_embedder(settings: Settings, client: openai.OpenAI | None) -> Embedder:
    """The embedder the settings name; its width must match KGSTREAM_EMBEDDING_DIM."""
    if settings.embedding_backend == "openai":
        embedder: Embedder = OpenAIEmbedder(
            _required(client, "embedding_backend=openai"),
            settings.embedding_model,
            settings.embedding_dim,
            max_attempts=settings.llm_max_attempts,
        )
    else:
        embedder = OnnxMiniLmEmbedder(
            batch_size=settings.embed_batch_size, intra_op_threads=cpu_threads(settings.cpu_threads)
        )
    if embedder.dim != settings.embedding_dim:
        raise ConfigurationError(
            f"{embedder.model_id} makes {embedder.dim}-d vectors but KGSTREAM_EMBEDDING_DIM is "
            f"{settings.embedding_dim}"
        )
    return embedder


def build_extractor(settings: Settings, client: openai.OpenAI | None) -> Extractor:
    """The extractor the settings name."""
    if settings.extractor_backend == "openai":
        from services.core.llm import OpenAIExtractor

        return OpenAIExtractor(
            _required(client, "extractor_backend=openai"),
            settings.llm_model,
            max_attempts=settings.llm_max_attempts,
            concurrency=settings.llm_concurrency,
            gleanings=settings.extraction_gleanings,
        )
    return SpacyExtractor(relations=settings.spacy_relations)


def build_adjudicator(
    settings: Settings, client: openai.OpenAI | None, meter: ModelMeter = NO_METER
) -> Callable[[str, str, str], Awaitable[bool]] | None:
    """The resolver's LLM adjudicator when one is configured, else None (the ambiguous band
    stays unmerged)."""
    if client is None or not settings.resolution_llm_adjudication:
        return None
    from services.core.llm.adjudicator import make_adjudicator

    return make_adjudicator(client, settings.llm_model, settings.llm_max_attempts, meter)


def build_context_adjudicator(
    settings: Settings, client: openai.OpenAI | None, meter: ModelMeter = NO_METER
) -> Callable[[str, str, str, str, str], Awaitable[bool]] | None:
    """Consolidation's LLM adjudicator (two names with a sentence each), on the same switch as
    the resolver's: None offline or with KGSTREAM_RESOLUTION_LLM_ADJUDICATION off."""
    if client is None or not settings.resolution_llm_adjudication:
        return None
    from services.core.llm.adjudicator import make_context_adjudicator

    return make_context_adjudicator(client, settings.llm_model, settings.llm_max_attempts, meter)


def _required(client: openai.OpenAI | None, what: str) -> openai.OpenAI:
    if client is None:
        raise ConfigurationError(f"{what} needs KGSTREAM_OPENAI_BASE_URL")
    return client
