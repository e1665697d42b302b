"""`kgstream dlq list|replay` against the real database and broker."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from services.core.db.engine import make_engine
from services.core.dead_letters import list_dead_letters, replay_dead_letters
from services.core.producer import make_producer
from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps, RawRecord, handle_record
from tests.support.cli import kgstream
from tests.support.faults import add_fault_trigger
from tests.support.records import records_on

pytestmark = pytest.mark.integration


async def test_list_and_replay(deps: IndexerDeps, settings: Settings) -> None:
    raw = json.dumps(
        {
            "event_id": "big-1",
            "type": "upsert",
            "doc_id": "big",
            "text": "x" * 300,
            "occurred_at": "2024-01-01T00:00:00Z",
        }
    ).encode()
    small = replace(deps, max_document_bytes=100)
    outcome = await handle_record(small, RawRecord(settings.documents_topic, 0, 7, b"big", raw))
    assert outcome == "dead_lettered"

    listed = kgstream(settings, "dlq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (letter,) = json.loads(listed.stdout)
    assert letter["reason"] == "oversize"
    assert letter["offset"] == 7
    assert letter["key"] == "big"

    missing = kgstream(settings, "dlq", "replay", "--id", "999")
    assert missing.returncode == 2
    assert "no unreplayed dead letter with id [999]" in missing.stderr

    replayed = kgstream(settings, "dlq", "replay", "--id", str(letter["id"]))
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 1 dead letter(s)" in replayed.stdout
    assert topic_values(settings) == [raw]
    after = json.loads(kgstream(settings, "dlq", "list", "--json").stdout)
    assert after == []


def topic_values(settings: Settings) -> list[bytes]:
    """Every record value on the documents topic (both partitions)."""
    bootstrap = str(settings.kafka_bootstrap_servers)
    return [bytes(m.value) for m in records_on(bootstrap, settings.documents_topic, [0, 1])]


def unreplayed(settings: Settings) -> list[dict[str, object]]:
    listed = kgstream(settings, "dlq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout))


async def test_replay_sends_each_letter_once_and_reports_the_refused(
    deps: IndexerDeps, settings: Settings
) -> None:
    """Finding 9: one letter larger than the producer's request size made the replay exit with
    a traceback after sending the others, and mark none replayed: the next replay sent them all
    again."""
    small = [b"{not json %d" % i for i in range(14)]
    huge = b"{" + b"x" * 5_000_000
    for offset, raw in enumerate([*small[:7], huge, *small[7:]]):
        rec = RawRecord(settings.documents_topic, 0, offset, b"k%d" % offset, raw)
        assert await handle_record(deps, rec) == "dead_lettered"
    (huge_id,) = [d["id"] for d in unreplayed(settings) if d["reason"] == "oversize"]

    first = kgstream(settings, "dlq", "replay")
    assert first.returncode == 1, first.stdout + first.stderr
    assert "Traceback" not in first.stderr
    assert f"dead letter #{huge_id} not replayed: MessageSizeTooLargeError" in first.stderr
    assert "replayed 14 dead letter(s), 1 not replayed" in first.stdout
    assert sorted(topic_values(settings)) == sorted(small)
    assert [d["id"] for d in unreplayed(settings)] == [huge_id]

    second = kgstream(settings, "dlq", "replay")
    assert second.returncode == 1, second.stdout + second.stderr
    assert "replayed 0 dead letter(s), 1 not replayed" in second.stdout
    assert sorted(topic_values(settings)) == sorted(small)  # nothing sent twice


async def test_a_replayed_event_is_indexed_once(deps: IndexerDeps, settings: Settings) -> None:
    """A decoded event that was dead-lettered (here: too many chunks) claimed its event id; the
    replay gives the id back, so the replayed record is applied rather than skipped as a
    duplicate, and a second copy of it (a replay that crashed before marking) is skipped."""
    raw = json.dumps(
        {
            "event_id": "long-1",
            "type": "upsert",
            "doc_id": "long",
            "text": "Marie Curie worked in Paris. " * 200,
            "occurred_at": "2024-01-01T00:00:00Z",
        }
    ).encode()
    bounded = replace(deps, max_document_chunks=1)
    failed = RawRecord(settings.documents_topic, 0, 3, b"long", raw)
    assert await handle_record(bounded, failed) == "dead_lettered"

    # The first mark fails: what a crash after the broker's ack and before the mark leaves.
    add_fault_trigger(
        str(settings.database_url),
        "mark_fault",
        "BEFORE UPDATE OF replayed_at ON dead_letters",
        "IF nextval('mark_fault_seq') = 1 THEN RAISE EXCEPTION 'injected: crashed'; END IF;"
        " RETURN NEW;",
    )
    crashed = kgstream(settings, "dlq", "replay")
    assert crashed.returncode == 1, crashed.stdout + crashed.stderr
    assert "Traceback" not in crashed.stderr
    assert "stopped, the database failed" in crashed.stderr
    assert topic_values(settings) == [raw]
    assert len(unreplayed(settings)) == 1  # not lost: still there to replay

    replayed = kgstream(settings, "dlq", "replay")
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 1 dead letter(s)" in replayed.stdout
    assert topic_values(settings) == [raw, raw]
    assert unreplayed(settings) == []
    first = RawRecord(settings.documents_topic, 0, 0, b"long", raw)
    assert await handle_record(deps, first) == "applied"
    assert await handle_record(deps, replace(first, offset=1)) == "duplicate"


async def test_an_unreadable_batch_is_not_replayed(deps: IndexerDeps, settings: Settings) -> None:
    """An `undecodable_batch` letter holds a whole record batch, not an event: replaying it
    would only dead-letter it again. A replay of everything leaves it alone with one notice and
    succeeds when the others went; asked for by id, it is reported as not replayed."""
    batch = RawRecord(
        settings.documents_topic, 0, 4, None, b"\x00batch", unreadable="offsets 2..4 (lz4)"
    )
    assert await handle_record(deps, batch) == "dead_lettered"
    bad = RawRecord(settings.documents_topic, 0, 5, b"k", b"{not json")
    assert await handle_record(deps, bad) == "dead_lettered"
    (batch_id,) = [d["id"] for d in unreplayed(settings) if d["reason"] == "undecodable_batch"]

    done = kgstream(settings, "dlq", "replay")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.strip() == (
        f"1 unreadable batch letter(s) left alone: #{batch_id} (an unreadable record batch is "
        "not an event: publish its documents again from their source)"
    )
    assert done.stdout.strip() == "replayed 1 dead letter(s)"
    assert topic_values(settings) == [b"{not json"]
    assert [d["id"] for d in unreplayed(settings)] == [batch_id]

    again = kgstream(settings, "dlq", "replay")  # nothing else left: still a success
    assert again.returncode == 0, again.stdout + again.stderr
    assert "replayed 0 dead letter(s)" in again.stdout

    asked = kgstream(settings, "dlq", "replay", "--id", str(batch_id))
    assert asked.returncode == 1, asked.stdout + asked.stderr
    assert f"dead letter #{batch_id} not replayed: an unreadable record batch" in asked.stderr
    assert "replayed 0 dead letter(s), 1 not replayed" in asked.stdout
    assert [d["id"] for d in unreplayed(settings)] == [batch_id]


async def test_a_replay_sends_each_letter_at_most_once_while_its_sends_fail_again(
    deps: IndexerDeps, settings: Settings
) -> None:
    """Finding 5 of issue 30: the replay's id cursor had no upper bound, so the letters its own
    sends made (a running indexer dead-letters a still-bad record again, as a new letter at its
    new offset) were sent again in the same run, and so on: 48 records for 29 letters. Here
    each page is one letter and every send is dead-lettered again before the next page is
    read; the run sends the five letters there were when it started, each once."""
    topic = settings.documents_topic
    originals = [b"{still not json %d" % i for i in range(5)]
    for offset, raw in enumerate(originals):
        rec = RawRecord(topic, 0, offset, b"k%d" % offset, raw)
        assert await handle_record(deps, rec) == "dead_lettered"
    letters = sorted(int(str(d["id"])) for d in unreplayed(settings))
    engine = make_engine(str(settings.database_url))
    producer = make_producer(str(settings.kafka_bootstrap_servers), settings)
    sent: list[int] = []
    try:
        async for outcome in replay_dead_letters(engine, producer, topic, page=1):
            assert outcome.error is None, outcome
            sent.append(outcome.letter_id)
            # (without the bound, a storm that does not end by itself)
            assert len(sent) <= len(letters), f"{len(sent)} sent for {letters}: {sent}"
            # What the indexer does with the replayed record, which is still bad.
            (letter,) = await list_dead_letters(
                engine, include_replayed=True, ids=[outcome.letter_id]
            )
            again = RawRecord(topic, 1, len(sent), b"again", letter.raw)
            assert await handle_record(deps, again) == "dead_lettered"
    finally:
        producer.close()
        await engine.dispose()
    assert sent == letters, sent
    assert sorted(topic_values(settings)) == sorted(originals)
    assert len(unreplayed(settings)) == len(originals)  # the new letters wait for the next run
