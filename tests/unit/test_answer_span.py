"""The offline answer: question kinds and spans read from contexts (pure, no database)."""

from __future__ import annotations

import pytest

from services.retrieval.answer import cited_sources, extractive
from services.retrieval.answer_kind import DATE, NUMBER, ORGANISATION, PERSON, PLACE, classify
from services.retrieval.answer_span import Mention, answer_span
from services.retrieval.contexts import Retrieval, answer_contexts
from services.retrieval.schemas import Context


def ctx(chunk_id: int, title: str, text: str) -> Context:
    return Context(doc_id=f"d{chunk_id}", chunk_id=chunk_id, title=title, text=text, score=1.0)


LELAND = ctx(
    1,
    "Leland, North Carolina",
    "Leland is a town in Brunswick County, North Carolina. The film Maximum Overdrive was "
    "shot in and around Leland in 1986.",
)
OVERDRIVE = ctx(
    2,
    "Maximum Overdrive",
    "Maximum Overdrive is a 1986 American horror film written and directed by Stephen King. "
    "It stars Emilio Estevez.",
)
MENTIONS = [
    Mention(1, "Leland", "GPE"),
    Mention(1, "Brunswick County", "GPE"),
    Mention(1, "North Carolina", "GPE"),
    Mention(1, "Maximum Overdrive", "WORK_OF_ART"),
    Mention(2, "Maximum Overdrive", "WORK_OF_ART"),
    Mention(2, "American", "NORP"),
    Mention(2, "Stephen King", "PERSON"),
    Mention(2, "Emilio Estevez", "PERSON"),
]


@pytest.mark.parametrize(
    ("question", "form", "first_tier"),
    [
        ("Who directed the film that was shot in Leland in 1986?", "span", PERSON),
        ("When was the director of Jaws born?", "span", DATE),
        ("In which year did the band release its first album?", "span", DATE),
        ("How many people live in the town?", "span", NUMBER),
        ("Are Christopher Nolan and Sathish Kalathil both film directors?", "yesno", None),
        ("Which magazine was started first, Arthur's Magazine or First for Women?", "choice", None),
        # asked in place, at the end
        ("Scaredy Squirrel was written by who?", "span", PERSON),
        # the head is the phrase's last noun; the phrase ends at its first function word
        ("Simon & Simon starred which television and movie actor from the US?", "span", PERSON),
        ("What is the name of the pop band founded by one of the stars?", "span", ORGANISATION),
        ("She starred in what for seven years?", "span", None),
        # "language" names spaCy's LANGUAGE label; nationalities (NORP) come second
        ("What language were the books translated into?", "span", ("LANGUAGE",)),
        ("What nationality is the author?", "span", ("NORP", "LANGUAGE")),
        # facilities are places (spaCy's FAC); "how long" asks a measure
        ("What is the name of the castle in the city?", "span", PLACE),
        ("How long are the council terms in Tucson?", "span", NUMBER),
    ],
)
def test_question_kinds(question: str, form: str, first_tier: tuple[str, ...] | None) -> None:
    kind = classify(question)
    assert kind.form == form
    if first_tier is not None:
        assert kind.tiers[0] == first_tier
    elif form == "span":
        assert kind.tiers == ()  # no head noun: any entity


def test_choice_options_and_direction_ignore_the_options_words() -> None:
    kind = classify("Which magazine was started first, Arthur's Magazine or First for Women?")
    assert kind.options == ("Arthur's Magazine", "First for Women")
    assert kind.direction == "min"


def test_bridge_answer_is_the_person_in_the_second_hop_passage() -> None:
    question = "Who directed the film that was shot in or around Leland, North Carolina in 1986?"
    span = answer_span(question, [LELAND, OVERDRIVE], MENTIONS)
    assert span is not None
    assert span.text == "Stephen King"  # nearest "directed", not Emilio Estevez
    assert span.doc_id == "d2"
    assert "directed by Stephen King" in span.sentence


def test_the_question_s_own_names_are_not_answers() -> None:
    span = answer_span("Where is Leland?", [LELAND], MENTIONS)
    assert span is not None
    assert span.text == "Brunswick County, North Carolina"


def test_dates_are_read_from_the_text() -> None:
    span = answer_span("When was Maximum Overdrive released?", [OVERDRIVE], MENTIONS)
    assert span is not None
    assert span.text == "1986"


def test_choice_by_earliest_year() -> None:
    arthur = ctx(3, "Arthur's Magazine", "Arthur's Magazine (1844–1846) was an American monthly.")
    women = ctx(4, "First for Women", "First for Women is a woman's magazine started in 1989.")
    question = "Which magazine was started first, Arthur's Magazine or First for Women?"
    span = answer_span(question, [women, arthur], [])
    assert span is not None
    assert span.text == "Arthur's Magazine"


def test_yes_no_by_the_predicate_in_both_passages() -> None:
    nolan = ctx(5, "Christopher Nolan", "Christopher Nolan is an English film director.")
    kalathil = ctx(6, "Sathish Kalathil", "Sathish Kalathil is an Indian film director.")
    chef = ctx(7, "Jane Doe", "Jane Doe is a chef in Paris.")
    yes = answer_span(
        "Are Christopher Nolan and Sathish Kalathil both film directors?", [nolan, kalathil], []
    )
    no = answer_span("Are Christopher Nolan and Jane Doe both film directors?", [nolan, chef], [])
    assert yes is not None
    assert yes.text == "yes"
    assert no is not None
    assert no.text == "no"
    assert no.doc_id == "d7"  # the passage that lacks the predicate


def test_same_nationality_compares_entities_of_that_kind() -> None:
    a = ctx(8, "Ann Smith", "Ann Smith is an American actress.")
    b = ctx(9, "Bob Jones", "Bob Jones is a British actor.")
    mentions = [Mention(8, "American", "NORP"), Mention(9, "British", "NORP")]
    span = answer_span("Were Ann Smith and Bob Jones of the same nationality?", [a, b], mentions)
    assert span is not None
    assert span.text == "no"


def test_without_a_span_the_best_sentence_is_quoted() -> None:
    answer, support = extractive("What is a good recipe for bread?", [OVERDRIVE], MENTIONS)
    assert support == ""
    assert answer.endswith("[d2]")
    found, why = extractive("Who directed Maximum Overdrive?", [OVERDRIVE], MENTIONS)
    assert found == "Stephen King [d2]"
    assert why.startswith("Maximum Overdrive is a 1986 American horror film")
    assert answer_span("anything", [], MENTIONS) is None


def test_yes_needs_every_asked_property_and_titles_lose_their_disambiguation() -> None:
    viewpoint = ctx(
        10,
        "Woman's Viewpoint (magazine)",
        "The Woman's Viewpoint was a woman's "
        "magazine founded in Texas in 1923 and published by Florence M. Sterling.",
    )
    pick = ctx(
        11,
        "Pick Me Up (magazine)",
        "Pick Me Up! is a British weekly women's magazine "
        "that is published through the IPC Media group.",
    )
    question = "Are both magazines, the Woman's Viewpoint and Pick Me Up, British publications?"
    span = answer_span(question, [viewpoint, pick], [])
    assert span is not None
    assert span.text == "no"
    assert span.doc_id == "d10"


def test_a_place_and_its_region_are_one_answer() -> None:
    city = ctx(12, "Ohio State", "The university is located in Columbus, Ohio, near the river.")
    mentions = [Mention(12, "Columbus", "GPE"), Mention(12, "Ohio", "GPE")]
    span = answer_span("In which city is Ohio State located?", [city], mentions)
    assert span is not None
    assert span.text == "Columbus, Ohio"


def test_llm_citations_are_listed_and_unknown_ones_flagged() -> None:
    listed, unknown = cited_sources("King directed it [2][1], see also [7].", [LELAND, OVERDRIVE])
    assert listed == "[1] d1; [2] d2"
    assert unknown == [7]
    assert cited_sources("No citation here.", [LELAND]) == ("", [])


@pytest.mark.parametrize(
    ("question", "form"),
    [
        ("Which band was formed first The Exies or Circus Diablo ?", "choice"),
        ("Do Lafzon Ki Kahani is a remake of Always, released in what year?", "span"),
        ("The director Armando Iannucci has an OBE. Does Puneet Sira also have one?", "yesno"),
    ],
)
def test_question_forms_beyond_the_first_word(question: str, form: str) -> None:
    assert classify(question).form == form


def test_options_without_a_comma_and_size_words_compare_numbers() -> None:
    kind = classify("Which band was formed first The Exies or Circus Diablo ?")
    assert kind.options == ("Exies", "Circus Diablo")
    assert (kind.direction, kind.basis) == ("min", "date")
    larger = classify("Which plant is larger, the Pterocarya or the Cotula?")
    assert (larger.direction, larger.basis) == ("max", "number")


def test_counts_in_words_answer_how_many() -> None:
    text = ctx(13, "Deltha O'Neal", "O'Neal was selected for the Pro Bowl twice in his career.")
    span = answer_span("How many times was Deltha O'Neal selected for the Pro Bowl?", [text], [])
    assert span is not None
    assert span.text == "twice"


@pytest.mark.parametrize(
    ("question", "text", "answer"),
    [
        (
            "When did Louisville elect its first black mayor?",
            "Louisville elected its first black mayor in the 1970s, a decade after the reforms.",
            "1970s",
        ),
        (
            "When did Forest win the FA Cup?",
            "Forest won the FA Cup in 1898 and 1959.",
            "1898 and 1959",
        ),
        (
            "When did the Battle of Britain take place?",
            "The Battle of Britain took place from 10 July -- 31 October 1940.",
            "10 July -- 31 October 1940",
        ),
        (
            "When was the Palau constructed?",
            "The Palau was constructed in the 15th century.",
            "15th century",
        ),
        # a life span is two answers, born and died: not one range
        ("When was John Knox born?", "John Knox (1505–1572) was a Scottish reformer.", "1505"),
    ],
)
def test_dates_of_more_than_one_year(question: str, text: str, answer: str) -> None:
    span = answer_span(question, [ctx(14, "Passage", text)], [])
    assert span is not None
    assert span.text == answer


# The first hop names the producer; the second, reached through him, holds what is asked.
FILM = ctx(
    20,
    "Forced Vengeance",
    "Forced Vengeance is a 1982 action film produced by Chuck Norris in Hong Kong.",
)
SERIES = ctx(21, "Walker (character)", "The ranger played by Chuck Norris is called Cordell.")
OTHER = ctx(22, "Hong Kong", "Hong Kong is a city on the coast of southern China.")
HOP_MENTIONS = [
    Mention(20, "Forced Vengeance", "WORK_OF_ART"),
    Mention(20, "Chuck Norris", "PERSON"),
    Mention(20, "Hong Kong", "GPE"),
    Mention(21, "Chuck Norris", "PERSON"),
    Mention(21, "Cordell", "PERSON"),
    Mention(22, "Hong Kong", "GPE"),
    Mention(22, "China", "GPE"),
]
PRODUCER = "What was the name of Forced Vengeance's producer in Walker, Texas Ranger?"


def test_a_bridge_answer_moves_to_the_next_hop_of_the_best_chain() -> None:
    alone = answer_span(PRODUCER, [FILM, SERIES], HOP_MENTIONS)
    assert alone is not None
    assert alone.text == "Chuck Norris"  # the first hop's answer: the bridge
    span = answer_span(PRODUCER, [FILM, SERIES], HOP_MENTIONS, chain=(20, 21))
    assert span is not None
    assert span.text == "Cordell"  # the bridge, nearer "ranger", is excluded there
    assert span.doc_id == "d21"
    assert span.sentence == SERIES.text


def test_the_span_stands_when_it_bridges_nothing_or_the_next_hop_has_no_candidate() -> None:
    # the chain's next passage does not mention the span: no bridge
    span = answer_span(PRODUCER, [FILM, SERIES, OTHER], HOP_MENTIONS, chain=(20, 22))
    assert span is not None
    assert span.text == "Chuck Norris"
    # the next passage mentions the bridge but holds no other person
    lone = ctx(23, "Walker (character)", "Chuck Norris starred as the ranger.")
    mentions = [*HOP_MENTIONS, Mention(23, "Chuck Norris", "PERSON")]
    span = answer_span(PRODUCER, [FILM, lone], mentions, chain=(20, 23))
    assert span is not None
    assert span.text == "Chuck Norris"
    # a chain passage the caller was not shown (not among the contexts) is no next hop
    span = answer_span(PRODUCER, [FILM, OTHER], HOP_MENTIONS, chain=(20, 21))
    assert span is not None
    assert span.text == "Chuck Norris"


def test_the_answer_reads_the_chain_passages_beyond_the_top_contexts() -> None:
    fillers = [ctx(30 + i, f"Filler {i}", "Nothing here.") for i in range(6)]
    result = Retrieval("local", [FILM, *fillers, SERIES], chain=(20, 21))
    read = answer_contexts(result)
    assert [c.chunk_id for c in read] == [20, 30, 31, 32, 33, 21]
    assert answer_contexts(Retrieval("local", [FILM, *fillers, SERIES])) == [FILM, *fillers[:4]]
