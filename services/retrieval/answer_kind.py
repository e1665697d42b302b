"""What a question asks for (pure, by its wording): yes/no, a choice between named options, or a
span of an expected kind (person, place, date, number, nationality, organisation, work). The
rules are the classic ones of factoid QA question typing (wh-word, then the head noun after
"what"/"which"), not weights fitted to a dev set."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# spaCy entity labels (the ones the indexer stores on mentions) per answer kind; dates and
# numbers are found in the sentence text (the indexer does not store them as entities).
PERSON = ("PERSON",)
PLACE = ("GPE", "LOC", "FAC")
NATIONALITY = ("NORP", "LANGUAGE")
ORGANISATION = ("ORG",)
WORK = ("WORK_OF_ART", "PRODUCT", "EVENT", "LAW")
DATE = ("DATE",)
NUMBER = ("NUMBER",)
# A role ("a lecturer at the Collegium Albertinum", "Count of Tripoli") is seldom one entity: it
# is read as the phrase a copula or an appointment introduces (answer_span.role_phrases).
ROLE = ("ROLE",)
ANY_ENTITY = PERSON + PLACE + NATIONALITY + ORGANISATION + WORK

# Head nouns after "what"/"which"/"in which" and the kinds they ask for (first kind preferred).
Tiers = tuple[tuple[str, ...], ...]
HEAD_NOUNS: dict[str, Tiers] = {}
for _nouns, _labels in (
    (
        "person man woman actor actress director singer author writer player politician "
        "artist musician producer composer poet novelist comedian footballer coach king queen "
        "president founder star host presenter character rapper guitarist drummer architect",
        (PERSON,),
    ),
    (
        "city country state town place location county region village island continent "
        "province river mountain capital district borough neighborhood neighbourhood area "
        "venue stadium arena airport lake sea ocean "
        # facilities (spaCy's FAC: buildings, airports, highways, bridges)
        "castle bridge building church cathedral palace tower museum park street road highway "
        "hotel hospital monument temple mosque square terminal",
        (PLACE, ORGANISATION),
    ),
    ("nationality ethnicity religion", (NATIONALITY,)),
    ("language dialect", (("LANGUAGE",), NATIONALITY)),  # the head noun names the label
    (
        "company band team organization organisation group university college school club "
        "network channel label party agency airline firm brand newspaper magazine studio "
        "league institution station",
        (ORGANISATION, WORK),
    ),
    (
        "film movie book novel song album show series game play opera poem work single "
        "episode sitcom documentary treaty law act constitution",
        (WORK, ORGANISATION),
    ),
    ("year date decade century month day", (DATE,)),
    (
        "position title rank role office job post occupation profession designation status career",
        (ROLE, ANY_ENTITY),
    ),
    (
        "number population amount height length size age percentage cost price distance capacity",
        (NUMBER,),
    ),
):
    for _noun in _nouns.split():
        HEAD_NOUNS[_noun] = _labels
        HEAD_NOUNS[_noun + "s"] = _labels


def word_set(listed: str) -> frozenset[str]:
    """A word set from a space-separated list (keeps the vocabularies readable)."""
    return frozenset(listed.split())


AUXILIARIES = word_set("is are was were do does did can could has have had will would should am")
# Comparison words and the direction they pick: "min" = the smaller date or number wins.
EARLIER = word_set("first earlier earliest older oldest before sooner")
LATER = word_set("later latest younger youngest newer newest recent recently after")
MORE = word_set(
    "more most larger largest bigger biggest taller tallest longer longest higher highest "
    "greater greatest heavier heaviest"
)
FEWER = word_set("fewer fewest less least smaller smallest shorter shortest lower lowest lighter")
_WORD = re.compile(r"[A-Za-z0-9]+")
WH_WORDS = word_set("what which who whom whose when where why how")
CONNECTORS = word_set("of the and for de du la le von van")
ARTICLES = word_set("a an the")
# Words that end the noun phrase after "what" / "which": verbs, prepositions, articles.
PHRASE_ENDS = (
    AUXILIARIES
    | ARTICLES
    | WH_WORDS
    | word_set("in on at to for from by with as than that been being")
)
# A sentence ends at . ! ? before a capital, digit, quote or bracket (not "St. louis"), or a line.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])|\n+")
_OPTIONS = re.compile(r",\s*([^,?]+?)\s+or\s+([^,?]+?)\s*\??\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class AnswerKind:
    """What the question asks for."""

    form: str  # "yesno" | "choice" | "span"
    tiers: tuple[tuple[str, ...], ...] = ()  # span: acceptable labels, best tier first; () = any
    options: tuple[str, ...] = ()  # choice: the named options
    direction: str = ""  # choice: "min" or "max", "" = by overlap with the question
    basis: str = ""  # choice: compare by "date" (earlier / later words) or "number" (more / fewer)
    terms: frozenset[str] = field(default_factory=frozenset)  # the question's words, lowered


def words(text: str) -> list[str]:
    """Lower-cased alphanumeric words."""
    return [w.lower() for w in _WORD.findall(text)]


def sentences(text: str) -> list[str]:
    """The non-blank sentences of a text, stripped."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def classify(question: str) -> AnswerKind:
    """The answer kind of a question, by its wording (its last sentence: "X has an OBE. Does
    Y also have one?")."""
    tokens = words(question)
    terms = frozenset(tokens)
    options, rest = _choice_options(question)
    if options:
        direction, basis = _direction(frozenset(words(rest)))  # "first" in "First for Women"
        return AnswerKind("choice", options=options, direction=direction, basis=basis, terms=terms)
    last = words((sentences(question) or [""])[-1])
    if last and last[0] in AUXILIARIES and not terms & WH_WORDS:
        return AnswerKind("yesno", terms=terms)
    return AnswerKind("span", tiers=_tiers(tokens), terms=terms)


def _choice_options(question: str) -> tuple[tuple[str, ...], str]:
    """The two named options of "..., X or Y?" (or "... first X or Y?"): names (capitalised or
    numbers), at most eight words each; and the question without them. No options: ((), q)."""
    match = _OPTIONS.search(question)
    if match is not None:
        first, second = match.groups()
        rest = question[: match.start()]
    else:
        # no comma: the first option is the run of capitalised words (and connectors) before
        # " or " ("Which band was formed first The Exies or Circus Diablo?")
        head, sep, second = question.rstrip(" ?").rpartition(" or ")
        before = head.split()
        start = len(before)
        while start > 0 and (before[start - 1][:1].isupper() or before[start - 1] in CONNECTORS):
            start -= 1
        while start < len(before) and before[start] in CONNECTORS:
            start += 1
        if not sep or start == len(before) or start == 0:
            return (), question
        first, rest = " ".join(before[start:]), " ".join(before[:start])
    options = tuple(
        re.sub(r"^(?:the|a|an)\s+", "", m.strip(" \"'?"), flags=re.IGNORECASE)
        for m in (first, second)
    )
    if all(o and (o[0].isupper() or o[0].isdigit()) and len(o.split()) <= 8 for o in options):
        return options, rest
    return (), question


def _direction(terms: frozenset[str]) -> tuple[str, str]:
    """("min" | "max" | "", "date" | "number" | "")."""
    for words_, direction, basis in (
        (EARLIER, "min", "date"),
        (LATER, "max", "date"),
        (FEWER, "min", "number"),
        (MORE, "max", "number"),
    ):
        if terms & words_:
            return direction, basis
    return "", ""


# Wh-words that fix the kind on their own, among the question's first three words.
OPENINGS: dict[str, Tiers] = {
    "who": (PERSON, ORGANISATION + NATIONALITY),
    "whom": (PERSON, ORGANISATION + NATIONALITY),
    "whose": (PERSON, ORGANISATION + NATIONALITY),
    "when": (DATE,),
    "where": (PLACE, ORGANISATION),
}


def _tiers(tokens: list[str]) -> Tiers:
    """Expected labels from the wh-word and the head noun after it; () = any entity."""
    for word in tokens[:3]:
        if word in OPENINGS:
            return OPENINGS[word]
    if tokens and tokens[-1] in OPENINGS:  # asked in place: "... written by who?"
        return OPENINGS[tokens[-1]]
    for i, word in enumerate(tokens):
        if word == "how" and tokens[i + 1 : i + 2] in (["many"], ["much"], ["old"], ["long"]):
            return (NUMBER,)
        if word in ("what", "which"):
            start = i + 1
            opening = tokens[start : start + 2]
            if len(opening) == 2 and opening[0] in AUXILIARIES and opening[1] in ARTICLES:
                start += 2  # "what is the name of the band": the phrase follows
            nouns = [n for n in _noun_phrase(tokens[start : start + 6]) if n in HEAD_NOUNS]
            return HEAD_NOUNS[nouns[-1]] if nouns else ()
    return ()


def _noun_phrase(after: list[str]) -> list[str]:
    """The words of the phrase a wh-word opens: up to its first function word ("what for
    seven years" has none), "of" and its article excepted ("what type of film", "the name of
    the band"). Its head is its last noun ("which television and movie actor" asks for an
    actor)."""
    out: list[str] = []
    for word in after:
        if word in ARTICLES and out[-1:] == ["of"]:
            continue  # "the name of the band"
        if word in PHRASE_ENDS:
            break
        out.append(word)
    return out
