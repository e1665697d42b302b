"""The property tests' corpus (tests/integration/test_graph_properties.py, test_curations.py):
hand-written so that entity resolution across documents cannot depend on arrival order (see
test_graph_properties' docstring), one chunk per sentence, and memoised real models."""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from services.core.chunking import Chunk, Chunker, content_hash
from services.core.embedding import Embedder, OnnxMiniLmEmbedder
from services.core.extraction import Extraction, Extractor, SpacyExtractor
from services.core.settings import Settings
from tests.conftest import Infra
from tests.support.graph import apply_events, indexer_deps

# doc id -> (title, variants); a variant is a list of sentences.
CORPUS: dict[str, tuple[str, list[list[str]]]] = {
    "doc-einstein": (
        "Albert Einstein",
        [
            [
                "The physicist Albert Einstein was born in Germany.",
                "As a student, Albert Einstein studied physics in Switzerland.",
                "In 1933 Albert Einstein joined Princeton University.",
                "Niels Bohr debated quantum theory with Albert Einstein.",
            ],
            [
                "The physicist Albert Einstein was born in Germany.",
                "For seven years Albert Einstein worked at the patent office in Bern.",
                "In 1933 Albert Einstein joined Princeton University.",
                "Niels Bohr debated quantum theory with Albert Einstein.",
            ],
            [
                "The physicist Albert Einstein was born in Germany.",
                "As a student, Albert Einstein studied physics in Switzerland.",
                "In 1922 Albert Einstein visited Tokyo.",
            ],
        ],
    ),
    "doc-merkel": (
        "Angela Merkel",
        [
            [
                "The politician Angela Merkel studied chemistry in Leipzig.",
                "From 2005 to 2021 Angela Merkel led Germany from Berlin.",
                "As chancellor, Angela Merkel often met Emmanuel Macron in Paris.",
            ],
            [  # a sentence inserted before a kept one: the kept chunk moves
                "The politician Angela Merkel studied chemistry in Leipzig.",
                "In 2021 the Social Democrat Olaf Scholz succeeded Angela Merkel.",
                "From 2005 to 2021 Angela Merkel led Germany from Berlin.",
            ],
        ],
    ),
    "doc-microsoft": (
        "Microsoft",
        [
            [
                "In 1975 Bill Gates founded Microsoft with Paul Allen.",
                "In 1986 Microsoft moved its headquarters to Seattle.",
                "Since February 2014 Satya Nadella has led Microsoft.",
            ],
            [
                "In 1975 Bill Gates founded Microsoft with Paul Allen.",
                "In 1986 Microsoft moved its headquarters to Seattle.",
                "In 2000 Steve Ballmer succeeded Bill Gates at Microsoft.",
            ],
            [
                "In 1975 Bill Gates founded Microsoft with Paul Allen.",
                "In 2016 Microsoft bought LinkedIn.",
                "Since February 2014 Satya Nadella has led Microsoft.",
            ],
        ],
    ),
    "doc-toyota": (
        "Toyota",
        [
            [
                "The carmaker Toyota builds cars in Japan.",
                "For decades Toyota competed with General Motors in the United States.",
                "In 1988 Toyota opened a factory in Kentucky.",
            ],
            [
                "The carmaker Toyota builds cars in Japan.",
                "Until the 1990s Toyota competed with Volkswagen in Europe.",
                "In 1988 Toyota opened a factory in Kentucky.",
            ],
        ],
    ),
    "doc-london": (
        "London",
        [
            [
                "The city of London is the capital of England.",
                "For many years William Shakespeare wrote plays in London.",
                "The River Thames flows through London.",
            ],
            [
                "The city of London is the capital of England.",
                "The novelist Charles Dickens described the streets of London.",
                "The River Thames flows through London.",
            ],
            [
                "The city of London is the capital of England.",
                "For many years William Shakespeare wrote plays in London.",
                "The economist Adam Smith visited Paris.",
            ],
        ],
    ),
    "doc-seattle": (
        "Seattle",
        [
            [
                "The city of Seattle lies in Washington State.",
                "In 1994 Jeff Bezos started Amazon in Seattle.",
                "In 1986 Microsoft moved its headquarters to Seattle.",
            ],
            [
                "The city of Seattle lies in Washington State.",
                "In 1986 Microsoft moved its headquarters to Seattle.",
                "In 1916 Boeing was founded in Seattle.",
            ],
        ],
    ),
    # No title (the first chunk is the first sentence), and facts with every variant: a
    # lead-in cut (0 -> 1) or added (1 -> 2) changes which chunk is first, and the facts,
    # which ride on the first chunk, must move with it.
    "doc-factory": (
        "",
        [
            [
                "Early records of the works are incomplete.",
                "Acme Corp makes brass valves in Ohio.",
                "Jane Roe buys parts for Acme Corp.",
            ],
            [
                "Acme Corp makes brass valves in Ohio.",
                "Jane Roe buys parts for Acme Corp.",
            ],
            [
                "A preface was added in 1990.",
                "Acme Corp makes brass valves in Ohio.",
                "Jane Roe buys parts for Acme Corp.",
            ],
        ],
    ),
}
# doc id -> variant -> the facts its publisher gives with it (document event v2): provided
# entities that extraction finds too (Microsoft, Seattle), ones it does not (MSFT, FOUNDED), and
# a variant that is not extracted at all. Variants without an entry are v1 events.
_FACTORY = {
    "entities": [
        {"name": "Acme Corp", "type": "ORG"},
        {"name": "Jane Roe", "type": "PERSON", "aliases": ["J. Roe"]},
    ],
    "relationships": [{"source": "J. Roe", "target": "Acme Corp", "type": "BUYS_FROM"}],
}
FACTS: dict[str, dict[int, dict[str, Any]]] = {
    "doc-factory": {0: _FACTORY, 1: _FACTORY, 2: _FACTORY},
    "doc-microsoft": {
        0: {
            "entities": [
                {"name": "Microsoft", "type": "ORG"},
                {"name": "Bill Gates", "type": "PERSON", "description": "Co-founder."},
            ],
            "relationships": [{"source": "Bill Gates", "target": "Microsoft", "type": "FOUNDED"}],
        },
        2: {"entities": [{"name": "Microsoft", "type": "ORG", "aliases": ["MSFT"]}]},
    },
    "doc-seattle": {
        1: {
            "extraction": "provided",
            "entities": [{"name": "Seattle", "type": "GPE"}, {"name": "Boeing", "type": "ORG"}],
            "relationships": [
                {"source": "Boeing", "target": "Seattle", "type": "FOUNDED_IN", "weight": 0.8}
            ],
        },
    },
    "doc-toyota": {
        1: {
            "entities": [{"name": "Toyota", "type": "ORG"}, {"name": "Volkswagen", "type": "ORG"}],
            "relationships": [
                {"source": "Toyota", "target": "Volkswagen", "type": "COMPETES_WITH"}
            ],
        },
    },
}
DOC_IDS = sorted(CORPUS)
T0 = datetime(2024, 1, 1, tzinfo=UTC)
_SENTENCE_END = re.compile(r"(?<=\.)\s+")


class SentenceChunker(Chunker):
    """One chunk per sentence (the title stays with the first): edits replace whole chunks
    and chunk boundaries never cut a name."""

    def __init__(self) -> None:
        super().__init__(chunk_tokens=256, overlap=0)

    def split(self, text: str) -> list[Chunk]:
        chunks: list[Chunk] = []
        start = 0
        for end, nxt in [(m.start(), m.end()) for m in _SENTENCE_END.finditer(text)] + [
            (len(text), len(text))
        ]:
            piece = text[start:end]
            if piece.strip():
                chunks.append(
                    Chunk(
                        ord=len(chunks),
                        text=piece,
                        start_char=start,
                        end_char=end,
                        token_count=self.count_tokens(piece),
                        content_hash=content_hash(piece),
                    )
                )
            start = nxt
        return chunks


@dataclass
class MemoEmbedder:
    """The real embedder, each text embedded once per module (examples repeat texts)."""

    inner: Embedder
    cache: dict[str, list[float]] = field(default_factory=dict)
    dim: int = field(init=False)
    model_id: str = field(init=False)

    def __post_init__(self) -> None:
        self.dim, self.model_id = self.inner.dim, self.inner.model_id

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        missing = sorted({t for t in texts if t not in self.cache})
        if missing:
            self.cache.update(zip(missing, self.inner.embed(missing), strict=True))
        return [self.cache[t] for t in texts]


@dataclass
class MemoExtractor:
    """The real spaCy extractor, each text extracted once per module."""

    inner: Extractor
    cache: dict[str, Extraction] = field(default_factory=dict)
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.inner.name

    def extract(self, texts: Sequence[str]) -> list[Extraction]:
        missing = sorted({t for t in texts if t not in self.cache})
        if missing:
            self.cache.update(zip(missing, self.inner.extract(missing), strict=True))
        return [self.cache[t] for t in texts]


@dataclass(frozen=True)
class Env:
    """What building a graph in a fresh database needs."""

    server_url: str
    embedder: MemoEmbedder
    extractor: MemoExtractor
    pool: ThreadPoolExecutor

    async def build(
        self, url: str, events: Sequence[dict[str, Any]], batch_size: int = 1
    ) -> list[str]:
        """Apply ``events`` to the database at ``url``; the outcomes."""
        async with self.deps(url) as deps:
            return list(await apply_events(deps, events, batch_size))

    def deps(self, url: str) -> Any:
        """An in-process indexer's dependencies on ``url`` (an async context manager)."""
        return indexer_deps(
            url,
            embedder=self.embedder,
            extractor=self.extractor,
            executor=self.pool,
            chunker=SentenceChunker(),
            settings=Settings(),
        )


def corpus_text(doc_id: str, variant: int) -> str:
    """The text of a document's variant (variants cycle)."""
    variants = CORPUS[doc_id][1]
    return " ".join(variants[variant % len(variants)])


def corpus_facts(doc_id: str, variant: int) -> dict[str, Any]:
    """The v2 fields of a document's variant (with ``schema_version``), or none."""
    facts = FACTS.get(doc_id, {}).get(variant % len(CORPUS[doc_id][1]))
    return {"schema_version": 2, **facts} if facts else {}


@pytest.fixture(scope="module")
def env(
    infra: Infra,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> Env:
    """Graphs built in fresh databases on the suite's server, models memoised per module."""
    return Env(infra.server_url, MemoEmbedder(embedder), MemoExtractor(extractor), cpu_pool)
