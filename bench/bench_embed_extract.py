"""The bare embed + extract loop: the reference the ingest pipeline's throughput is held to.

Reads a document-events JSONL file, chunks each upsert's ``title + "\\n" + text`` with
Chunker(180, 30), then, 16 chunks at a time in arrival order (as a stream worker
sees them), embeds them (ONNX MiniLM) and extracts entities/relations (spaCy).
Prints one JSON object.

    .venv/bin/python bench/bench_embed_extract.py [events.jsonl] [--group 16]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EVENTS = REPO_ROOT / ".." / "shared" / "data" / "hotpotqa-train100" / "events.jsonl"


def _load_passages(path: Path) -> list[tuple[str, str]]:
    docs: dict[str, str] = {}
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("type") != "upsert":
                continue
            # Last upsert per doc wins, as in the indexer.
            docs[event["doc_id"]] = f"{event.get('title') or ''}\n{event.get('text') or ''}"
    return list(docs.items())


def main() -> None:
    """Run the loop and print throughput and extraction statistics as JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("events", nargs="?", type=Path, default=DEFAULT_EVENTS)
    parser.add_argument("--group", type=int, default=16, help="chunks per embed/extract call")
    parser.add_argument("--chunk-tokens", type=int, default=180)
    parser.add_argument("--overlap", type=int, default=30)
    args = parser.parse_args()

    # Runnable as a plain script from anywhere: the repo root holds the `services` package.
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from services.core.chunking import Chunker
    from services.core.embedding import OnnxMiniLmEmbedder
    from services.core.extraction import CO_OCCURS, SpacyExtractor
    from services.core.settings import Settings

    t0 = time.perf_counter()
    chunker = Chunker(args.chunk_tokens, args.overlap)
    embedder = OnnxMiniLmEmbedder(batch_size=16)
    # The relations the indexer runs with (KGSTREAM_SPACY_RELATIONS), so the ratio compares like
    # with like.
    extractor = SpacyExtractor(relations=Settings().spacy_relations)
    # Warm both models so one-off initialisation is not billed to throughput.
    embedder.embed(["warm up"])
    extractor.extract(["Warm up in Paris."])
    load_s = time.perf_counter() - t0

    passages = _load_passages(args.events.resolve())
    t_start = time.perf_counter()
    chunk_doc: list[int] = []
    chunk_texts: list[str] = []
    for d, (_, text) in enumerate(passages):
        for chunk in chunker.split(text):
            chunk_doc.append(d)
            chunk_texts.append(chunk.text)
    chunk_s = time.perf_counter() - t_start

    embed_s = extract_s = 0.0
    n_entities = n_relations = n_svo = 0
    for b in range(0, len(chunk_texts), args.group):
        group = chunk_texts[b : b + args.group]
        t = time.perf_counter()
        vectors = embedder.embed(group)
        embed_s += time.perf_counter() - t
        t = time.perf_counter()
        extractions = extractor.extract(group)
        extract_s += time.perf_counter() - t
        assert len(vectors) == len(extractions) == len(group)
        for ex in extractions:
            n_entities += len(ex.entities)
            n_relations += len(ex.relations)
            n_svo += sum(1 for r in ex.relations if r.type != CO_OCCURS)
    total_s = time.perf_counter() - t_start

    # For comparison: the whole corpus in one call (globally length-sorted batches).
    t = time.perf_counter()
    embedder.embed(chunk_texts)
    embed_sorted_s = time.perf_counter() - t

    n_docs = len(passages)
    n_chunks = len(chunk_texts)
    print(
        json.dumps(
            {
                "events": str(args.events),
                "passages": n_docs,
                "chunks": n_chunks,
                "seconds": round(total_s, 3),
                "passages_per_s": round(n_docs / total_s, 2),
                "chunks_per_s": round(n_chunks / total_s, 2),
                "chunk_seconds": round(chunk_s, 3),
                "embed_seconds": round(embed_s, 3),
                "embed_passages_per_s": round(n_chunks / embed_s, 2),
                "embed_all_sorted_passages_per_s": round(n_chunks / embed_sorted_s, 2),
                "extract_seconds": round(extract_s, 3),
                "extract_chunks_per_s": round(n_chunks / extract_s, 2),
                "entities_per_doc": round(n_entities / n_docs, 2),
                "relations_per_doc": round(n_relations / n_docs, 2),
                "svo_relations_per_doc": round(n_svo / n_docs, 2),
                "cooccurrence_relations_per_doc": round((n_relations - n_svo) / n_docs, 2),
                "model_load_seconds": round(load_s, 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
