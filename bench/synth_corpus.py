"""A seeded synthetic corpus in the document event contract (schemas/document_event.v1.json),
for scale benchmarks: NOT copies of one corpus.

Statistics it aims for (measured and printed by the CLI):
- entities are people (first name x surname pools), places (seeded syllables + a place
  ending: "X", "X County", "Port X", "Lake X") and organisations (syllables + "Institute",
  "Corporation", ...): forms spaCy's English model tags as PERSON / GPE / ORG;
- entity frequencies are heavy-tailed: an entity's rank r in a topic is drawn with weight
  1 / r**ZIPF_S, topics themselves and ranks across the universe are Zipf-distributed too,
  and RARE_SHARE of the mentions are uniform over the universe (one-off names), so a few
  entities appear in hundreds or thousands of documents and most in one or two;
- entities are shared across documents: every document draws most of its entities from its
  topic (a pool of related entities) and the rest from the whole universe, so documents link
  into communities and a few hubs link the communities;
- documents vary in length: the number of sentences is log-normal (median ~5, a tail of long
  documents up to MAX_SENTENCES); each sentence links 1-3 entities with a relation verb.

    .venv/bin/python bench/synth_corpus.py --documents 1000 [--seed 7] [--out events.jsonl]
        [--questions questions.jsonl]

Without --out only the statistics are printed (JSON). The universe grows with the corpus
(ENTITIES_PER_DOCUMENT distinct names per document are available), so statistics per
document stay comparable from 1k to 100k documents.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import random
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ZIPF_S = 1.1  # exponent of entity ranks inside a topic
TOPIC_S = 0.8  # exponent of topic popularity
GLOBAL_S = 0.9  # exponent of entity ranks across the whole universe (the hubs)
TOPIC_SIZE = 40  # entities per topic
HOME_SHARE = 0.65  # share of a document's mentions drawn from its own topic
RARE_SHARE = 0.15  # share drawn uniformly from the universe (the long tail of one-off names)
ENTITIES_PER_DOCUMENT = 4  # size of the universe per document of the corpus
NARROW_NAMES = 40_000  # larger universes also draw from the wide name space (see universe)
SENTENCES_MEDIAN = 5
SENTENCES_SIGMA = 0.7
MAX_SENTENCES = 60
EPOCH = "2024-01-01T00:00:00Z"


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


FIRST = _words(
    "James Mary Robert Patricia John Jennifer Michael Linda David Elizabeth William Barbara "
    "Richard Susan Joseph Jessica Thomas Sarah Charles Karen Christopher Lisa Daniel Nancy "
    "Matthew Betty Anthony Margaret Mark Sandra Donald Ashley Steven Kimberly Paul Emily Andrew "
    "Donna Joshua Michelle Kenneth Carol Kevin Amanda Brian Dorothy George Melissa Timothy "
    "Deborah Ronald Stephanie Edward Rebecca Jason Sharon Jeffrey Laura Ryan Cynthia Jacob "
    "Kathleen Gary Amy Nicholas Angela Eric Shirley Jonathan Anna Stephen Brenda Larry Pamela "
    "Justin Emma Scott Nicole Brandon Helen Benjamin Samantha Samuel Katherine Gregory Christine "
    "Alexander Debra Frank Rachel Patrick Carolyn Raymond Janet Jack Catherine Dennis Maria "
    "Jerry Heather Tyler Diane Aaron Ruth Jose Julie Adam Olivia Nathan Joyce Henry Virginia "
    "Douglas Victoria Zachary Kelly Peter Lauren Kyle Christina Ethan Joan Walter Evelyn Noah "
    "Judith Jeremy Megan Christian Andrea Keith Cheryl Roger Hannah Terry Jacqueline Gerald "
    "Martha Harold Gloria Sean Teresa Austin Ann Carl Sara Arthur Madison Lawrence Frances"
)
SURNAMES = _words(
    "Smith Johnson Williams Brown Jones Garcia Miller Davis Rodriguez Martinez Hernandez Lopez "
    "Gonzalez Wilson Anderson Thomas Taylor Moore Jackson Martin Lee Perez Thompson White Harris "
    "Sanchez Clark Ramirez Lewis Robinson Walker Young Allen King Wright Scott Torres Nguyen Hill "
    "Flores Green Adams Nelson Baker Hall Rivera Campbell Mitchell Carter Roberts Gomez Phillips "
    "Evans Turner Diaz Parker Cruz Edwards Collins Reyes Stewart Morris Morales Murphy Cook "
    "Rogers Gutierrez Ortiz Morgan Cooper Peterson Bailey Reed Kelly Howard Ramos Kim Cox Ward "
    "Richardson Watson Brooks Chavez Wood James Bennett Gray Mendoza Ruiz Hughes Price Alvarez "
    "Castillo Sanders Patel Myers Long Ross Foster Jimenez Powell Jenkins Perry Russell Sullivan "
    "Bell Coleman Butler Henderson Barnes Gonzales Fisher Vasquez Simmons Romero Jordan "
    "Patterson Alexander Hamilton Graham Reynolds Griffin Wallace Moreno West Cole Hayes Bryant "
    "Herrera Gibson Ellis Tran Medina Aguilar Stevens Murray Ford Castro Marshall Owens Harrison "
    "Fernandez McDonald Woods Washington Kennedy Wells Vargas Henry Chen Freeman Webb Tucker "
    "Guzman Burns Crawford Olson Simpson Porter Hunter Gordon Mendez Silva Shaw Snyder Mason "
    "Dixon Munoz Hunt Hicks Holmes Palmer Wagner Black Robertson Boyd Rose Stone Salazar Fox "
    "Warren Mills Meyer Rice Schmidt Garza Daniels Ferguson Nichols Stephens Soto Weaver Ryan "
    "Gardner Payne Grant Dunn Kelley Spencer Hawkins Arnold Pierce Vazquez Hansen Peters Santos "
    "Hart Bradley Knight Elliott Cunningham Duncan Armstrong Hudson Carroll Lane Riley Andrews "
    "Alvarado Ray Delgado Berry Perkins Hoffman Johnston Matthews Pena Richards Contreras Willis"
)
ONSETS = _words("br cal dor fen gar hal kin lor mar nor pel ros sal tam val wes ash bel cor dun")
MIDDLES = _words("a e i o u ar en il on or")
CODAS = _words("ton ham ford wick dale field mont bury stead ridge")
PLACE_FORMS = ("{}", "{}", "{}", "{} County", "Port {}", "Lake {}")
ORG_FORMS = (
    "{} Institute",
    "{} Corporation",
    "{} University",
    "Bank of {}",
    "{} Records",
    "{} Airlines",
    "{} Football Club",
    "{} Museum",
)
KINDS = ("person", "person", "place", "org")  # people are half of the named entities
VERBS = {
    ("person", "person"): ("married", "worked with", "succeeded", "mentored", "met"),
    ("person", "place"): ("was born in", "moved to", "lived in", "died in", "campaigned in"),
    ("person", "org"): ("founded", "joined", "led", "left", "studied at"),
    ("org", "place"): ("is based in", "opened an office in", "expanded to", "moved to"),
    ("org", "org"): ("acquired", "partnered with", "competed with", "merged with"),
    ("place", "place"): ("borders", "is twinned with", "lies north of", "trades with"),
}
OPENERS = ("", "", "", "In {year}, ", "Later, ", "According to local records, ", "By {year}, ")
TAILS = (
    ".",
    ".",
    " in {year}.",
    " after a long dispute.",
    " for {n} years.",
    ", which drew wide attention.",
)
SOLO = (
    "{a} was widely covered in the press in {year}.",
    "Little is known about {a} before {year}.",
    "{a} remains the subject of debate among historians.",
)
TRIPLE = "{a} {verb} {b}, together with {c}{tail}"


@dataclass(frozen=True)
class Entity:
    """One entity of the universe: its surface name and kind."""

    name: str
    kind: str


@dataclass
class Stats:
    """What a generated corpus looks like (the CLI prints these)."""

    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    mentions: Counter[str] = field(default_factory=Counter)  # documents naming each entity
    lengths: list[int] = field(default_factory=list)  # sentences per document

    def add(self, sentences: Sequence[str], names: set[str]) -> None:
        """Count one document."""
        self.documents += 1
        self.sentences += len(sentences)
        self.tokens += sum(len(s.split()) for s in sentences)
        self.lengths.append(len(sentences))
        self.mentions.update(names)

    def to_json(self) -> dict[str, Any]:
        """Documents, tokens, distinct names, entities per document and the frequency tail."""
        freq = sorted(self.mentions.values(), reverse=True)
        lengths = sorted(self.lengths)
        n = max(self.documents, 1)

        def at(values: Sequence[int], q: float) -> int:
            return values[min(len(values) - 1, int(q * len(values)))] if values else 0

        return {
            "documents": self.documents,
            "sentences": self.sentences,
            "tokens": self.tokens,
            "tokens_per_document": round(self.tokens / n, 1),
            "sentences_per_document": {
                "median": at(lengths, 0.5),
                "p90": at(lengths, 0.9),
                "max": lengths[-1] if lengths else 0,
            },
            "distinct_entity_names": len(freq),
            "entity_names_per_document": round(sum(freq) / n, 2),
            "documents_per_entity": {
                "top": freq[:5],
                "p50": at(freq[::-1], 0.5),
                "p90": at(freq[::-1], 0.9),
                "p99": at(freq[::-1], 0.99),
                "in_one_document": sum(1 for f in freq if f == 1),
            },
        }


def zipf_cdf(n: int, s: float = ZIPF_S) -> list[float]:
    """Cumulative weights of ranks 1..n under weight 1 / rank**s."""
    return list(itertools.accumulate(1.0 / (r**s) for r in range(1, n + 1)))


def draw(rng: random.Random, cdf: Sequence[float]) -> int:
    """A 0-based rank drawn from a cumulative weight table."""
    return min(bisect.bisect_left(cdf, rng.random() * cdf[-1]), len(cdf) - 1)


def _word(rng: random.Random, wide: bool) -> str:
    """A name-like word: a syllable and a place-name ending (2,000 words); ``wide`` adds
    two-syllable words (~42,000)."""
    second = rng.choice(ONSETS) + rng.choice(MIDDLES) if wide and rng.random() < 0.5 else ""
    return (rng.choice(ONSETS) + rng.choice(MIDDLES) + second + rng.choice(CODAS)).capitalize()


def _name(rng: random.Random, kind: str, wide: bool) -> str:
    if kind == "person":
        first = rng.choice(FIRST)
        surname = _word(rng, wide) if wide and rng.random() < 0.5 else rng.choice(SURNAMES)
        return f"{first} {surname}"
    if kind == "place":
        return rng.choice(PLACE_FORMS).format(_word(rng, wide))
    return rng.choice(ORG_FORMS).format(_word(rng, wide))


def universe(rng: random.Random, size: int) -> list[Entity]:
    """``size`` entities with distinct names, in the order they were drawn. Universes above
    NARROW_NAMES (corpora above 10,000 documents) draw from the wide name space: the narrow
    one holds ~60,000 names and would repeat itself."""
    wide = size > NARROW_NAMES
    seen: set[str] = set()
    out: list[Entity] = []
    for _ in range(20 * size):  # a bound on redraws of taken names, not a budget
        if len(out) == size:
            break
        kind = rng.choice(KINDS)
        name = _name(rng, kind, wide)
        if name not in seen:
            seen.add(name)
            out.append(Entity(name, kind))
    if len(out) < size:
        raise ValueError(f"only {len(out)} distinct names for a universe of {size}")
    return out


@dataclass
class Corpus:
    """A seeded corpus of ``documents`` upsert events; iterate ``events()`` to generate."""

    documents: int
    seed: int = 7
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        size = max(TOPIC_SIZE, ENTITIES_PER_DOCUMENT * self.documents)
        self.entities = universe(self.rng, size)
        self.topics = [
            self.entities[i : i + TOPIC_SIZE] for i in range(0, size - TOPIC_SIZE + 1, TOPIC_SIZE)
        ]
        self.in_topic = zipf_cdf(TOPIC_SIZE)
        self.topic_cdf = zipf_cdf(len(self.topics), TOPIC_S)
        self.global_cdf = zipf_cdf(len(self.entities), GLOBAL_S)
        self.topic_order = list(range(len(self.topics)))
        self.rng.shuffle(self.topic_order)  # popular topics are not the first-drawn entities

    def _pick(self, topic: list[Entity]) -> Entity:
        roll = self.rng.random()
        if roll < HOME_SHARE:
            return topic[draw(self.rng, self.in_topic)]
        if roll < HOME_SHARE + RARE_SHARE:
            return self.rng.choice(self.entities)
        return self.entities[draw(self.rng, self.global_cdf)]

    def _sentence(self, topic: list[Entity], lead: Entity, first: bool) -> tuple[str, list[Entity]]:
        """One sentence and the entities it names; the first one names the lead (the title)."""
        rng = self.rng
        year, n = rng.randint(1850, 2023), rng.randint(2, 40)
        arity = rng.choices((1, 2, 3), weights=(1, 6, 2))[0]
        named = lead if first or rng.random() < 0.4 else self._pick(topic)
        other = self._pick(topic)
        if arity == 1 or named == other:
            return rng.choice(SOLO).format(a=named.name, year=year), [named]
        a, b = (named, other) if (named.kind, other.kind) in VERBS else (other, named)
        if (a.kind, b.kind) not in VERBS:
            return rng.choice(SOLO).format(a=named.name, year=year), [named]
        verb = rng.choice(VERBS[(a.kind, b.kind)])
        tail = rng.choice(TAILS).format(year=year, n=n)
        opener = rng.choice(OPENERS).format(year=year)
        if arity == 3:
            c = self._pick(topic)
            if c not in (a, b):
                text = TRIPLE.format(a=a.name, verb=verb, b=b.name, c=c.name, tail=tail)
                return opener + text, [a, b, c]
        return f"{opener}{a.name} {verb} {b.name}{tail}", [a, b]

    def _length(self) -> int:
        drawn = self.rng.lognormvariate(math.log(SENTENCES_MEDIAN), SENTENCES_SIGMA)
        return max(1, min(MAX_SENTENCES, round(drawn)))

    def events(self) -> Iterator[dict[str, Any]]:
        """The upsert events, in order (deterministic for a seed)."""
        for i in range(self.documents):
            topic = self.topics[self.topic_order[draw(self.rng, self.topic_cdf)]]
            lead = self._pick(topic)
            sentences, named = [], {lead.name}
            for k in range(self._length()):
                sentence, entities = self._sentence(topic, lead, first=k == 0)
                sentences.append(sentence[0].upper() + sentence[1:])
                named.update(e.name for e in entities)
            self.stats.add(sentences, named)
            doc_id = f"synth-{self.seed}-{i:06d}"
            yield {
                "event_id": f"{doc_id}@1",
                "type": "upsert",
                "doc_id": doc_id,
                "title": lead.name,
                "text": " ".join(sentences),
                "metadata": {"dataset": "synthetic", "seed": self.seed, "names": sorted(named)},
                "occurred_at": EPOCH,
            }


def questions(events: Sequence[dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` questions naming two entities that share a document; gold = the documents naming
    both (from the events' ``metadata.names``)."""
    rng = random.Random(seed)
    by_name: dict[str, set[str]] = {}
    for e in events:
        for name in e["metadata"]["names"]:
            by_name.setdefault(name, set()).add(e["doc_id"])
    out: list[dict[str, Any]] = []
    candidates = [e for e in events if len(e["metadata"]["names"]) >= 2]
    for i in range(min(n, len(candidates))):
        event = rng.choice(candidates)
        a, b = rng.sample(event["metadata"]["names"], 2)
        out.append(
            {
                "qid": f"synth-q{i}",
                "question": f"How is {a} connected to {b}?",
                "question_type": "bridge",
                "gold_doc_ids": sorted(by_name[a] & by_name[b]),
            }
        )
    return out


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """One compact JSON object per line."""
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None, help="events JSONL to write")
    parser.add_argument("--questions", type=Path, default=None, help="questions JSONL to write")
    parser.add_argument("--n-questions", type=int, default=100)
    args = parser.parse_args(argv)
    corpus = Corpus(args.documents, args.seed)
    events = list(corpus.events())
    if args.out is not None:
        write_jsonl(args.out, events)
    if args.questions is not None:
        write_jsonl(args.questions, questions(events, args.n_questions, args.seed))
    json.dump(corpus.stats.to_json(), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
