"""Time scopes of questions and times of sentences (services/retrieval/time_scope.py), and the
offline answer that reads them (services/retrieval/answer_span.py): the span from the sentence
that holds in the scope."""

from __future__ import annotations

import math

from services.retrieval.answer import abstains, extractive
from services.retrieval.answer_span import Mention
from services.retrieval.schemas import Context
from services.retrieval.time_scope import Scope, question_scope, sentence_times, stated_times


def test_question_scopes() -> None:
    assert question_scope("Who owned the house from 1811 to 1827?") == Scope(1811, 1827)
    assert question_scope("What was held from Apr 1935 to Apr 1937 by him?") == Scope(1935, 1937)
    assert question_scope("Who led it between 1990 and 1985?") == Scope(1985, 1990)
    assert question_scope("Which conference did it join in 1954?") == Scope(1954, 1954)
    assert question_scope("Which team did he play for before 2010?") == Scope(-math.inf, 2010)
    assert question_scope("Where did she work after Jan 2001?") == Scope(2001, math.inf)
    assert question_scope("Who has led it since 1999?") == Scope(1999, math.inf)
    assert question_scope("Who directed Jaws?") is None


def test_sentence_times() -> None:
    assert sentence_times("George Peter owned it from 1811 to 1827.") == [(1811, 1827)]
    assert sentence_times("He was mayor (1935–1940), and since 1941 a judge.") == [
        (1935, 1940),
        (1941, math.inf),
    ]
    assert sentence_times("She played there until 2 March 1911.") == [(1911, 1911)]
    assert sentence_times("Born in 1880, she played there until 1911.") == [
        (1880, 1911),
        (1880, 1880),
    ]
    assert sentence_times("In 1916 Newton Baker bought it.") == [(1916, 1916)]
    assert sentence_times("No year here.") == []


def test_stated_times_say_where() -> None:
    text = "He became a master in 1982 and a grandmaster from 1989 to 1990."
    found = stated_times(text)
    assert [t for t, _ in found] == sentence_times(text) == [(1989, 1990), (1982, 1982)]
    assert [text[a:b] for _, (a, b) in found] == ["from 1989 to 1990", "1982"]


def test_how_closely_times_fit_a_scope() -> None:
    scope = Scope(1811, 1827)
    assert scope.fit([(1811, 1827)]) == 1.0
    assert scope.fit([(1811, 1811)]) == 1 / 17  # one year of the seventeen
    assert scope.fit([(1800, 1811), (1811, 1827)]) == 1.0  # the best of the times
    assert scope.fit([(1830, 1840)]) == 0.0
    assert scope.fit([(1811, math.inf)]) == 1.0  # an open end says nothing past the scope
    assert Scope(1990, math.inf).fit([(1990, 2001)]) == 1.0  # "since 1990", then "until 2001"
    assert Scope(1990, math.inf).fit([(2001, 2001)]) == 1 / 12  # began before 2001
    assert Scope(1990, math.inf).fit([(1980, 1985)]) == 0.0


def _ctx(text: str) -> Context:
    return Context(doc_id="house", chunk_id=1, title="The House", text=text, score=1.0)


MENTIONS = [
    Mention(1, "George Peter", "PERSON"),
    Mention(1, "Newton Baker", "PERSON"),
    Mention(1, "Thomas Cook", "PERSON"),
]
PAGE = _ctx(
    "The house was owned by George Peter from 1811 to 1827. "
    "The house was owned by Thomas Cook from 1827 to 1916. "
    "In 1916 the house was bought by Newton Baker, who owned it until 1920."
)


def test_the_span_of_the_sentence_that_holds_in_the_scope() -> None:
    answer, _ = extractive("Who owned the house from 1811 to 1827?", [PAGE], MENTIONS)
    assert answer.startswith("George Peter")
    answer, _ = extractive("Who owned the house from 1917 to 1919?", [PAGE], MENTIONS)
    assert answer.startswith("Newton Baker")


def test_without_a_scope_or_a_dated_sentence_the_best_sentence_stands() -> None:
    answer, _ = extractive("Who owned the house?", [PAGE], MENTIONS)
    assert answer.startswith("George Peter")
    undated = _ctx("The house was owned by George Peter.")
    answer, _ = extractive("Who owned the house from 1917 to 1919?", [undated], MENTIONS)
    assert answer.startswith("George Peter")
    assert not abstains(answer)
    assert abstains(extractive("Who owned the house?", [], MENTIONS)[0])  # nothing retrieved


def test_the_name_nearest_the_time_in_the_scope() -> None:
    """One sentence, two facts: the name stated beside the year that holds is the answer, though
    the other is nearer the question's words."""
    text = _ctx(
        "Krasenkow became a national master in 1982, an International Master in 1988 and "
        "an International Grandmaster in 1989."
    )
    titles = [
        Mention(1, "national master", "WORK_OF_ART"),
        Mention(1, "International Master", "WORK_OF_ART"),
        Mention(1, "International Grandmaster", "WORK_OF_ART"),
    ]
    answer, _ = extractive("Which honour did Krasenkow become in 1988?", [text], titles)
    assert answer.startswith("International Master")
    answer, _ = extractive("Which honour did Krasenkow become in 1989?", [text], titles)
    assert answer.startswith("International Grandmaster")


def test_the_sentence_that_fits_the_scope_best() -> None:
    """Both sentences hold in 1811-1827 and match as many of the question's words; the one whose
    years are nearer the scope's is read, though the other's name stands nearer its time."""
    page = _ctx(
        "Thomas Cook owned the house between 1805 and 1827. "
        "George Peter, a banker of the town, owned it from 1811 to 1826."
    )
    answer, _ = extractive("Who owned the house from 1811 to 1827?", [page], MENTIONS)
    assert answer.startswith("George Peter")


def test_a_role_is_the_phrase_a_copula_introduces() -> None:
    """A role is seldom an entity: the phrase after "was" / "became" / "served as" is read, the
    one beside the year that holds."""
    page = _ctx(
        "From 1997 to 2003 he was a lecturer at the Collegium Albertinum, a seminary in Bonn. "
        "He became a national master of the USSR in 1982 and served as team captain in 1988."
    )
    mentions = [Mention(1, "the Collegium Albertinum", "ORG"), Mention(1, "Bonn", "GPE")]
    answer, _ = extractive("What position did he have from 1997 to 2003?", [page], mentions)
    assert answer.startswith("a lecturer at the Collegium Albertinum")
    answer, _ = extractive("Which rank did he hold in 1982?", [page], mentions)
    assert answer.startswith("a national master of the USSR")
    answer, _ = extractive("What role did he have in 1988?", [page], mentions)
    assert answer.startswith("team captain")
    # a question that asks for a person reads no role
    answer, _ = extractive("Who taught at the seminary from 1997 to 2003?", [page], mentions)
    assert not answer.startswith("a lecturer")
