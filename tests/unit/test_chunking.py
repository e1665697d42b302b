"""Chunker: exact substrings, token limits, overlap, sentence-boundary cuts."""

from __future__ import annotations

import hashlib
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.core.chunking import Chunk, Chunker

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker(40, 8)


def _check_invariants(text: str, chunks: list[Chunk], chunker: Chunker) -> None:
    for i, chunk in enumerate(chunks):
        assert chunk.ord == i
        assert text[chunk.start_char : chunk.end_char] == chunk.text
        assert chunk.text == chunk.text.strip()
        assert chunk.content_hash == hashlib.sha256(chunk.text.encode()).hexdigest()
        assert chunk.token_count == chunker.count_tokens(chunk.text)
        # Re-encoding a slice may differ by a token at a split multi-byte character.
        assert chunk.token_count <= chunker.chunk_tokens + 1
    for prev, nxt in itertools.pairwise(chunks):
        assert prev.start_char < nxt.start_char
        # Overlapping or adjacent: no text is skipped between chunks.
        assert nxt.start_char <= prev.end_char or not text[prev.end_char : nxt.start_char].strip()


@pytest.mark.parametrize("text", ["", "   ", "\n\t \n"])
def test_empty_and_whitespace_give_no_chunks(chunker: Chunker, text: str) -> None:
    assert chunker.split(text) == []


def test_short_text_is_one_trimmed_chunk(chunker: Chunker) -> None:
    text = "  Irwin Shaw was an American novelist.\n"
    chunks = chunker.split(text)
    assert len(chunks) == 1
    assert chunks[0].text == "Irwin Shaw was an American novelist."
    assert chunks[0].start_char == 2
    _check_invariants(text, chunks, chunker)


def test_long_text_overlaps_and_cuts_at_sentences() -> None:
    chunker = Chunker(60, 10)
    text = " ".join([SENTENCE] * 30)
    chunks = chunker.split(text)
    assert len(chunks) > 5
    _check_invariants(text, chunks, chunker)
    # A boundary is always within reach (14 tokens per sentence, slack 60 // 4 = 15),
    # so every chunk ends at a sentence end.
    assert all(c.text.endswith(".") for c in chunks)
    for prev, nxt in itertools.pairwise(chunks):
        assert nxt.start_char < prev.end_char  # overlap


def test_hard_cut_without_boundaries() -> None:
    chunker = Chunker(20, 5)
    text = " ".join(f"word{i}" for i in range(200))
    chunks = chunker.split(text)
    _check_invariants(text, chunks, chunker)
    assert max(c.token_count for c in chunks[:-1]) >= 18
    assert chunks[-1].text.endswith("word199")


def test_multibyte_text_keeps_valid_offsets(chunker: Chunker) -> None:
    text = "Café 東京 naïve 🎉 emoji. " * 40
    chunks = chunker.split(text)
    assert len(chunks) > 1
    _check_invariants(text, chunks, chunker)


def test_count_tokens_and_special_tokens(chunker: Chunker) -> None:
    assert chunker.count_tokens("") == 0
    assert chunker.count_tokens("hello world") == 2
    # Special-token text is plain text here, never an error.
    assert chunker.count_tokens("<|endoftext|>") > 1
    assert chunker.split("<|endoftext|>")[0].text == "<|endoftext|>"


def test_invalid_configuration() -> None:
    with pytest.raises(ValueError, match="overlap"):
        Chunker(10, 10)
    with pytest.raises(ValueError, match="chunk_tokens"):
        Chunker(0, 0)


def test_same_text_same_hashes(chunker: Chunker) -> None:
    text = " ".join([SENTENCE] * 10)
    assert [c.content_hash for c in chunker.split(text)] == [
        c.content_hash for c in chunker.split(text)
    ]


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=600))
def test_invariants_on_arbitrary_text(text: str) -> None:
    chunker = _HYPOTHESIS_CHUNKER
    chunks = chunker.split(text)
    if not text.strip():
        assert chunks == []
    _check_invariants(text, chunks, chunker)


_HYPOTHESIS_CHUNKER = Chunker(24, 6)
