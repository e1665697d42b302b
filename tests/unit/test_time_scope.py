"""Time scopes of questions and times of sentences (services/retrieval/time_scope.py), and the
offline answer that reads them (services/retrieval/answer_span.py): the span from the sentence
that holds in the scope."""

from __future__ import annotations

import math

from services.retrieval.answer import abstains, extractive
from services.retrieval.answer_span import Mention
from services.retrieval.schemas import Context
from services.retrieval.time_scope import Scope, question_scope, sentence_times


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
