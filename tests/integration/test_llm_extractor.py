"""The LLM extractor through the real openai client, over HTTP, against the local stub server;
and the indexer handler running it against the real database."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any

import pytest
from sqlalchemy import text

from services.core.embedding import OpenAIEmbedder
from services.core.errors import PermanentError, TransientError
from services.core.llm import OpenAIExtractor, make_openai_client
from services.core.llm import extractor as llm_extractor
from services.core.llm.client import call_with_retries, process_client
from services.core.llm.extractor import GLEANING_PROMPT
from services.core.llm.prompts import document
from services.core.models import build_extractor
from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps, RawRecord, handle_record
from tests.support.openai_stub import (
    OpenAIStub,
    count_tokens,
    document_blocks,
    extract_graph,
    hashed_embedding,
)

pytestmark = pytest.mark.integration

MODEL = "stub-model"
TEXT = "Marie Curie worked in Paris with Pierre Curie. Albert Einstein met Marie Curie in Brussels."
FIRST, SECOND = TEXT.split(". ", 1)
CHAT = "/chat/completions"


def extractor(
    stub: OpenAIStub,
    *,
    timeout: float = 5.0,
    attempts: int = 3,
    gleanings: int = 0,
    concurrency: int = 4,
) -> OpenAIExtractor:
    settings = Settings(openai_base_url=stub.base_url, llm_timeout_s=timeout)
    return OpenAIExtractor(
        make_openai_client(settings),
        MODEL,
        max_attempts=attempts,
        concurrency=concurrency,
        gleanings=gleanings,
        base_delay=0.01,
    )


def user_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "user"]


def assert_curie_graph(stub: OpenAIStub, result: Any) -> None:
    names = [e.name for e in result.entities]
    assert names == ["Marie Curie", "Paris", "Pierre Curie", "Albert Einstein", "Brussels"]
    for ent in result.entities:
        assert ent.type == "CONCEPT"
        assert (ent.start, ent.end) == (TEXT.find(ent.name), TEXT.find(ent.name) + len(ent.name))
    assert {(r.source, r.target, r.type, r.strength) for r in result.relations} == {
        ("Marie Curie", "Paris", "RELATED_TO", 0.5),
        ("Paris", "Pierre Curie", "RELATED_TO", 0.5),
        ("Albert Einstein", "Marie Curie", "RELATED_TO", 0.5),
        ("Marie Curie", "Brussels", "RELATED_TO", 0.5),
    }
    paris = next(e for e in result.entities if e.name == "Paris")
    assert paris.sentence == FIRST + "."  # the description
    brussels = next(r for r in result.relations if r.target == "Brussels")
    assert brussels.sentence == SECOND


def test_happy_path_maps_entities_relations_and_usage(openai_stub: OpenAIStub) -> None:
    ex = extractor(openai_stub)
    assert ex.name == f"openai:{MODEL}"
    [result] = ex.extract([TEXT])
    assert_curie_graph(openai_stub, result)

    [req] = openai_stub.requests_to(CHAT)
    body = req.body
    assert body["model"] == MODEL
    assert body["temperature"] == 0
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["strict"] is True
    schema = body["response_format"]["json_schema"]["schema"]
    assert set(schema["properties"]) == {"entities", "relationships"}
    assert user_messages(body) == [{"role": "user", "content": document(TEXT)}]

    content = json.dumps(extract_graph(TEXT))
    prompt = sum(count_tokens(m["content"]) + 4 for m in body["messages"])
    assert result.usage is not None
    assert result.usage.model == MODEL
    assert result.usage.calls == 1
    assert result.usage.prompt_tokens == prompt
    assert result.usage.completion_tokens == count_tokens(content)


def test_times_come_from_the_models_sides_and_from_descriptions(openai_stub: OpenAIStub) -> None:
    """A relationship's valid_from / valid_to are its span; an entity's description that
    states a time gives that time; a description without one gives none."""
    text = "Marie Curie taught in Paris from 1906 to 1934. Pierre Curie lived in Sceaux."
    [result] = extractor(openai_stub).extract([text])
    first = "Marie Curie taught in Paris from 1906 to 1934."
    spans = {(t.sentence, t.span.iso(), t.span.expression) for t in result.times}
    assert spans == {(first, ("1906-01-01", "1935-01-01"), "from 1906 to 1934")}
    taught = next(r for r in result.relations if r.target == "Paris")
    assert taught.sentence == first  # the time is read with the relationship's evidence
    schema = openai_stub.requests_to(CHAT)[0].body["response_format"]["json_schema"]["schema"]
    rel = schema["properties"]["relationships"]["items"]
    assert {"valid_from", "valid_to"} <= set(rel["required"])


def record_retry_delays(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pauses the extractor's retries choose, in order (still slept)."""
    delays: list[float] = []

    def sleep(delay: float) -> None:
        delays.append(delay)
        time.sleep(delay)

    def recording(*args: Any, **kwargs: Any) -> Any:
        return call_with_retries(*args, sleep=sleep, **kwargs)

    monkeypatch.setattr(llm_extractor, "call_with_retries", recording)
    return delays


# The longest pause each fault may cause: Retry-After: 0, or the test extractor's backoff.
MOST_DELAY = {"429": 0.0, "500": 0.01}


@pytest.mark.parametrize("fault", ["429", "500"])
def test_transient_status_then_success(
    openai_stub: OpenAIStub, fault: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    openai_stub.fail_next(fault)
    delays = record_retry_delays(monkeypatch)
    [result] = extractor(openai_stub).extract([TEXT])
    assert len(delays) == 1
    assert 0 <= delays[0] <= MOST_DELAY[fault]
    assert_curie_graph(openai_stub, result)
    assert len(openai_stub.requests_to(CHAT)) == 2
    assert result.usage is not None
    assert result.usage.calls == 1  # the failed request produced no completion


def test_timeout_then_success(openai_stub: OpenAIStub) -> None:
    # The stub holds the first request far longer than the client waits: the answer must come
    # from the retry while that request is still held, not from waiting it out.
    openai_stub.hang_s = 60
    openai_stub.fail_next("timeout")
    [result] = extractor(openai_stub, timeout=2).extract([TEXT])
    assert openai_stub.held == 1
    assert_curie_graph(openai_stub, result)
    assert len(openai_stub.requests_to(CHAT)) == 2


def test_malformed_json_then_success(openai_stub: OpenAIStub) -> None:
    openai_stub.fail_next("malformed")
    [result] = extractor(openai_stub).extract([TEXT])
    assert_curie_graph(openai_stub, result)
    assert len(openai_stub.requests_to(CHAT)) == 2
    assert result.usage is not None
    assert result.usage.calls == 2  # the malformed answer was paid for too
    one_prompt = sum(
        count_tokens(m["content"]) + 4 for m in openai_stub.requests_to(CHAT)[0].body["messages"]
    )
    assert result.usage.prompt_tokens == 2 * one_prompt


def test_schema_violation_then_success(openai_stub: OpenAIStub) -> None:
    answers = [json.dumps({"entities": [{"label": "x"}]}), json.dumps(extract_graph(TEXT))]
    openai_stub.chat_handler = lambda _body: answers.pop(0)
    [result] = extractor(openai_stub).extract([TEXT])
    assert_curie_graph(openai_stub, result)
    assert len(openai_stub.requests_to(CHAT)) == 2


def test_malformed_every_time_is_permanent(openai_stub: OpenAIStub) -> None:
    openai_stub.fail_next("malformed", times=3)
    with pytest.raises(PermanentError) as info:
        extractor(openai_stub, attempts=3).extract([TEXT])
    assert info.value.reason == "extraction_failed"
    assert "not JSON" in info.value.detail
    assert len(openai_stub.requests_to(CHAT)) == 3


def test_bad_request_is_not_retried(openai_stub: OpenAIStub) -> None:
    openai_stub.fail_next("400")
    with pytest.raises(PermanentError) as info:
        extractor(openai_stub, attempts=3).extract([TEXT])
    assert info.value.reason == "extraction_failed"
    assert "400" in info.value.detail
    assert len(openai_stub.requests_to(CHAT)) == 1


def test_unavailable_endpoint_is_transient(openai_stub: OpenAIStub) -> None:
    openai_stub.fail_next("500", times=3)
    with pytest.raises(TransientError):
        extractor(openai_stub, attempts=3).extract([TEXT])
    assert len(openai_stub.requests_to(CHAT)) == 3


def test_gleaning_adds_a_second_call_and_merges(openai_stub: OpenAIStub) -> None:
    def handler(body: dict[str, Any]) -> str:
        if len(user_messages(body)) == 1:
            return json.dumps(extract_graph(FIRST + "."))
        return json.dumps(
            {
                "entities": [{"name": "Brussels", "type": "location", "description": "A city."}],
                "relationships": [
                    {
                        "source": "Marie Curie",
                        "target": "Brussels",
                        "type": "visited",
                        "description": "She went there.",
                        "strength": 8,
                    }
                ],
            }
        )

    openai_stub.chat_handler = handler
    [result] = extractor(openai_stub, gleanings=1).extract([TEXT])
    first, second = openai_stub.requests_to(CHAT)
    assert [m["role"] for m in second.body["messages"]] == ["system", "user", "assistant", "user"]
    assert second.body["messages"][2]["content"] == handler(first.body)
    assert second.body["messages"][3]["content"] == GLEANING_PROMPT
    assert [e.name for e in result.entities] == ["Marie Curie", "Paris", "Pierre Curie", "Brussels"]
    brussels = result.entities[-1]
    assert (brussels.type, brussels.start) == ("LOCATION", TEXT.find("Brussels"))
    assert ("Marie Curie", "Brussels", "VISITED", 0.8) in {
        (r.source, r.target, r.type, r.strength) for r in result.relations
    }
    assert result.usage is not None
    assert result.usage.calls == 2


def test_gleaning_stops_when_nothing_was_missed(openai_stub: OpenAIStub) -> None:
    [result] = extractor(openai_stub, gleanings=3).extract([TEXT])
    # The stub answers follow-up turns with empty lists: one gleaning pass, then stop.
    assert len(openai_stub.requests_to(CHAT)) == 2
    assert_curie_graph(openai_stub, result)


def test_output_is_normalised(openai_stub: OpenAIStub) -> None:
    openai_stub.chat_handler = lambda _body: json.dumps(
        {
            "entities": [
                {"name": "marie  curie", "type": "person", "description": "A physicist."},
                {"name": "Marie Curie", "type": "PERSON", "description": "Duplicate."},
                {"name": "Paris", "type": "geo political", "description": "A city."},
                {"name": "Radium", "type": "", "description": "Not in the text."},
            ],
            "relationships": [
                {"source": "Marie Curie", "target": "Paris", "type": "works in",
                 "description": "d", "strength": 12},
                {"source": "MARIE CURIE", "target": "Paris", "type": "WORKS_IN",
                 "description": "weaker", "strength": 3},
                {"source": "Marie Curie", "target": "Nobel", "type": "won",
                 "description": "unknown target", "strength": 9},
                {"source": "Paris", "target": "Paris", "type": "is",
                 "description": "self", "strength": 9},
            ],
        }
    )  # fmt: skip
    [result] = extractor(openai_stub).extract([TEXT])
    assert [(e.name, e.type, e.start, e.sentence) for e in result.entities] == [
        ("marie curie", "PERSON", 0, "A physicist."),
        ("Paris", "GEO_POLITICAL", TEXT.find("Paris"), "A city."),
        ("Radium", "MISC", -1, "Not in the text."),
    ]
    assert [(r.source, r.target, r.type, r.strength) for r in result.relations] == [
        ("marie curie", "Paris", "WORKS_IN", 1.0)
    ]


def test_chunks_run_concurrently_within_the_bound(openai_stub: OpenAIStub) -> None:
    lock = threading.Lock()
    state = {"now": 0, "max": 0, "calls": 0}
    # The first two calls wait for each other, which only overlapping calls can do.
    pair = threading.Barrier(2, timeout=30)

    def overlapping(body: dict[str, Any]) -> str:
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
            state["calls"] += 1
            first_two = state["calls"] <= 2
        try:
            if first_two:
                pair.wait()
        finally:
            with lock:
                state["now"] -= 1
        return json.dumps(extract_graph(user_messages(body)[0]["content"]))

    openai_stub.chat_handler = overlapping
    texts = [f"Chunk Number{i} mentions Place{i}." for i in range(7)]
    results = extractor(openai_stub, concurrency=3).extract(texts)
    assert len(openai_stub.requests_to(CHAT)) == 7
    assert 2 <= state["max"] <= 3
    # Results come back in input order whatever order the calls finished in.
    for i, result in enumerate(results):
        assert [e.name for e in result.entities] == [f"Chunk Number{i}", f"Place{i}"]


def test_build_extractor_uses_the_configured_endpoint(openai_stub: OpenAIStub) -> None:
    settings = Settings(
        extractor_backend="openai", openai_base_url=openai_stub.base_url, llm_model=MODEL
    )
    ex = build_extractor(settings, process_client(settings))
    assert isinstance(ex, OpenAIExtractor)
    assert ex.extract([TEXT])[0].usage is not None
    assert openai_stub.requests_to(CHAT)[0].body["model"] == MODEL


def test_stub_serves_embeddings(openai_stub: OpenAIStub) -> None:
    openai_stub.embedding_dim = 64  # the width served when the request names none
    client = make_openai_client(Settings(openai_base_url=openai_stub.base_url))
    vectors = OpenAIEmbedder(client, "stub-embed", 64).embed(["Marie Curie", "Paris", ""])
    assert len(vectors) == 3
    for vector in vectors:
        assert len(vector) == 64
        assert sum(v * v for v in vector) == pytest.approx(1.0, abs=1e-5)
    assert vectors[0] == pytest.approx(hashed_embedding("Marie Curie", 64), abs=1e-6)
    # The client asks for base64; a requested width is honoured.
    assert openai_stub.requests_to("/embeddings")[0].body["encoding_format"] == "base64"
    sized = OpenAIEmbedder(client, "stub-embed", 32, send_dimensions=True).embed(["x"])
    assert len(sized[0]) == 32


async def test_indexer_stores_llm_graph_and_token_usage(
    deps: IndexerDeps, openai_stub: OpenAIStub
) -> None:
    llm_deps = dataclasses.replace(deps, extractor=extractor(openai_stub))
    event = {
        "event_id": "e-llm-1",
        "type": "upsert",
        "doc_id": "doc-llm",
        "title": "Curie",
        "text": TEXT,
        "occurred_at": "2024-01-01T00:00:00Z",
    }
    raw = json.dumps(event).encode()
    record = RawRecord(topic="docs", partition=0, offset=1, key=b"doc-llm", value=raw)
    assert await handle_record(llm_deps, record) == "applied"
    again = dataclasses.replace(record, offset=2)
    assert await handle_record(llm_deps, again) == "duplicate"

    async with deps.engine.connect() as conn:
        names = set((await conn.execute(text("SELECT name FROM entities"))).scalars())
        rels = (await conn.execute(text("SELECT count(*) FROM relationships"))).scalar_one()
        usage = (
            await conn.execute(
                text(
                    "SELECT doc_id, purpose, model, prompt_tokens, completion_tokens"
                    " FROM token_usage"
                )
            )
        ).all()
    assert {"Marie Curie", "Paris", "Pierre Curie", "Albert Einstein", "Brussels"} <= names
    assert rels >= 4
    requests = openai_stub.requests_to(CHAT)
    assert len(requests) == 1  # one chunk; the duplicate never reached the extractor
    assert len(usage) == 1
    doc_id, purpose, model, prompt_tokens, completion_tokens = usage[0]
    assert (doc_id, purpose, model) == ("doc-llm", "extraction", MODEL)
    assert prompt_tokens == sum(
        count_tokens(m["content"]) + 4 for m in requests[0].body["messages"]
    )
    assert completion_tokens > 0


def _event_record(event_id: str, offset: int, text_: str = TEXT) -> RawRecord:
    event = {
        "event_id": event_id,
        "type": "upsert",
        "doc_id": f"doc-{event_id}",
        "title": "Curie",
        "text": text_,
        "occurred_at": "2024-01-01T00:00:00Z",
    }
    return RawRecord("docs", 0, offset, b"k", json.dumps(event).encode())


async def test_unusable_llm_output_is_dead_lettered_as_extraction_failed(
    deps: IndexerDeps, openai_stub: OpenAIStub
) -> None:
    llm_deps = dataclasses.replace(deps, extractor=extractor(openai_stub, attempts=2))
    openai_stub.fail_next("malformed", times=2)
    assert await handle_record(llm_deps, _event_record("bad-llm", 11)) == "dead_lettered"
    async with deps.engine.connect() as conn:
        reasons = (await conn.execute(text("SELECT reason, event_id FROM dead_letters"))).all()
        docs = (await conn.execute(text("SELECT count(*) FROM documents"))).scalar_one()
    assert [tuple(r) for r in reasons] == [("extraction_failed", "bad-llm")]
    assert docs == 0


async def test_llm_outage_delays_but_does_not_dead_letter(
    deps: IndexerDeps, openai_stub: OpenAIStub
) -> None:
    # Every try of the first extraction fails with 500: the handler keeps the event and retries.
    llm_deps = dataclasses.replace(deps, extractor=extractor(openai_stub, attempts=2))
    openai_stub.fail_next("500", times=2)
    assert await handle_record(llm_deps, _event_record("outage", 12)) == "applied"
    async with deps.engine.connect() as conn:
        letters = (await conn.execute(text("SELECT count(*) FROM dead_letters"))).scalar_one()
    assert letters == 0
    assert len(openai_stub.requests_to(CHAT)) == 3


async def test_nul_in_text_is_dead_lettered_at_the_door(deps: IndexerDeps) -> None:
    # PostgreSQL text cannot hold NUL, so the contract refuses it before any work is done
    # (permanent database errors inside the transaction: test_error_boundary.py).
    outcome = await handle_record(deps, _event_record("nul", 13, "Marie Curie\u0000 in Paris."))
    assert outcome == "dead_lettered"
    async with deps.engine.connect() as conn:
        reasons = (await conn.execute(text("SELECT reason FROM dead_letters"))).scalars().all()
    assert reasons == ["contract_violation"]


async def test_adjudicator_asks_the_llm_and_treats_doubt_as_no_merge(
    openai_stub: OpenAIStub,
) -> None:
    from services.core.llm.adjudicator import make_adjudicator

    def same_if_both_curie(body: dict[str, Any]) -> str:
        user = body["messages"][-1]["content"]
        return json.dumps({"same": user.count("Curie") == 2})

    openai_stub.chat_handler = same_if_both_curie
    settings = Settings(openai_base_url=openai_stub.base_url, llm_timeout_s=5)
    adjudicate = make_adjudicator(make_openai_client(settings), MODEL, attempts=2)
    assert await adjudicate("Marie Curie", "M. Curie", "PERSON") is True
    assert await adjudicate("Marie Curie", "Marie Antoinette", "PERSON") is False
    asked = openai_stub.requests_to(CHAT)[0].body["messages"][-1]["content"]
    assert document_blocks(asked) == [("A", "Marie Curie"), ("B", "M. Curie")]
    openai_stub.chat_handler = lambda _body: "not json"
    assert await adjudicate("Marie Curie", "M. Curie", "PERSON") is False
