"""Embedders: the offline ONNX MiniLM (real model) and the OpenAI adapter (fake client)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import pytest

from services.core.embedding import (
    Embedder,
    EmbeddingDimensionError,
    OnnxMiniLmEmbedder,
    OpenAIEmbedder,
    minilm_tokenizer_path,
)


@pytest.fixture(scope="module")
def minilm() -> OnnxMiniLmEmbedder:
    return OnnxMiniLmEmbedder(batch_size=4)


def _cos(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_identity(minilm: OnnxMiniLmEmbedder) -> None:
    assert minilm.dim == 384
    assert minilm.model_id == "all-MiniLM-L6-v2-onnx-int8"
    assert isinstance(minilm, Embedder)
    assert minilm_tokenizer_path().name == "tokenizer.json"


def test_semantic_similarity(minilm: OnnxMiniLmEmbedder) -> None:
    guitar, plays, stocks = minilm.embed(
        ["A man is playing guitar.", "Someone plays a guitar.", "The stock market fell today."]
    )
    assert len(guitar) == 384
    assert all(abs(math.sqrt(_cos(v, v)) - 1.0) < 1e-4 for v in (guitar, plays, stocks))
    assert _cos(guitar, plays) > 0.6
    assert _cos(guitar, plays) > _cos(guitar, stocks) + 0.4


def test_order_and_batching_do_not_change_vectors(minilm: OnnxMiniLmEmbedder) -> None:
    texts = [
        "short",
        "a much longer sentence about a film directed by Christopher Nolan in 2010",
        "medium length text here",
        "x " * 200,
        "another one",
    ]
    batched = minilm.embed(texts)
    single = [minilm.embed([t])[0] for t in texts]
    for a, b in zip(batched, single, strict=True):
        assert _cos(a, b) > 0.9999
    assert minilm.embed([]) == []


def test_long_text_is_truncated_at_256_not_128(minilm: OnnxMiniLmEmbedder) -> None:
    # Words after piece 128 must still change the vector (the shipped tokenizer cut at 128).
    head = "alpha " * 150
    a, b = minilm.embed([head + "volcano eruption lava", head + "banking interest rates"])
    assert _cos(a, b) < 0.9999


def test_batch_plan_bounds_padding(minilm: OnnxMiniLmEmbedder) -> None:
    lengths = [10, 200, 11, 12, 190, 9, 13, 250]
    batches = minilm._plan_batches(lengths)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= minilm.batch_size
        width = max(lengths[i] for i in batch)
        pad = sum(width - lengths[i] for i in batch)
        assert pad <= minilm.max_padding * width * len(batch)


# --- OpenAIEmbedder with a fake client --------------------------------------------------


@dataclass
class _Item:
    index: int
    embedding: list[float]


@dataclass
class _Response:
    data: list[_Item]


class _FakeEmbeddings:
    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.calls: list[dict[str, Any]] = []

    def create(self, **kwargs: Any) -> _Response:
        self.calls.append(kwargs)
        items = [
            _Item(i, [float(len(text))] + [0.0] * (self.dim - 1))
            for i, text in enumerate(kwargs["input"])
        ]
        # Endpoints may return items out of order; the index field is authoritative.
        return _Response(list(reversed(items)))


class _FakeClient:
    def __init__(self, dim: int) -> None:
        self.embeddings = _FakeEmbeddings(dim)


def test_openai_embedder_batches_and_orders() -> None:
    client = _FakeClient(8)
    embedder = OpenAIEmbedder(cast(Any, client), "text-embedding-3-small", 8, batch_size=2)
    vectors = embedder.embed(["a", "bb", "ccc"])
    assert [len(v) for v in vectors] == [8, 8, 8]
    assert all(v[0] == pytest.approx(1.0) for v in vectors)  # normalised
    assert [c["input"] for c in client.embeddings.calls] == [["a", "bb"], ["ccc"]]
    assert "dimensions" not in client.embeddings.calls[0]
    assert embedder.model_id == "text-embedding-3-small"


def test_openai_embedder_rejects_wrong_dimension() -> None:
    embedder = OpenAIEmbedder(cast(Any, _FakeClient(16)), "m", 8)
    with pytest.raises(EmbeddingDimensionError, match="16-d"):
        embedder.embed(["hello"])
