"""Counting model calls (docs/metrics.md: ``kgstream_model_*``) without a metrics framework:
call sites report to a ``ModelMeter`` they are given; the composition root passes the
Prometheus one (services/core/telemetry/models.py), everything else gets ``NO_METER``.

``purpose`` names why the model was called: embed_chunks, embed_names, embed_query,
embed_reports, extract, adjudicate, report, route, answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: importing the extractor module loads spaCy
    from services.core.embedding import Embedder
    from services.core.extraction import Extraction, Extractor


class ModelMeter:
    """Receives one report per model call (or per batch of calls). This base counts nothing
    (tests, the CLI, the eval); services/core/telemetry/models.py has the Prometheus one."""

    def model_call(
        self,
        purpose: str,
        model: str,
        *,
        inputs: int,
        calls: int = 1,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        """``calls`` requests sent ``inputs`` texts and cost the tokens the endpoint reported."""


NO_METER = ModelMeter()


@runtime_checkable
class ReportsEmbeddingUsage(Protocol):
    """An embedder that can say how many tokens an embedding request cost (OpenAI path)."""

    def embed_with_usage(self, texts: Sequence[str]) -> tuple[list[list[float]], int]:
        """The vectors and the prompt tokens the endpoint reported."""
        ...


def embed_metered(
    embedder: Embedder, meter: ModelMeter, purpose: str, texts: Sequence[str]
) -> list[list[float]]:
    """``embedder.embed(texts)``, reported to ``meter`` (blocking, like ``embed``)."""
    if isinstance(embedder, ReportsEmbeddingUsage):
        vectors, tokens = embedder.embed_with_usage(texts)
    else:
        vectors, tokens = embedder.embed(texts), 0
    meter.model_call(purpose, embedder.model_id, inputs=len(texts), prompt_tokens=tokens)
    return vectors


def extract_metered(
    extractor: Extractor, meter: ModelMeter, texts: Sequence[str]
) -> list[Extraction]:
    """``extractor.extract(texts)``, reported to ``meter``: an LLM extractor's calls and tokens
    come from each extraction's usage; an offline one counts one call per batch."""
    extractions = extractor.extract(texts)
    usages = [x.usage for x in extractions if x.usage is not None]
    model = usages[0].model if usages else extractor.name
    meter.model_call(
        "extract",
        model,
        inputs=len(texts),
        calls=sum(u.calls for u in usages) if usages else 1,
        prompt_tokens=sum(u.prompt_tokens for u in usages),
        completion_tokens=sum(u.completion_tokens for u in usages),
    )
    return extractions
