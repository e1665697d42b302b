"""Answer scoring as the HotpotQA / MuSiQue scorers do it, plus containment."""

from __future__ import annotations

import pytest

from services.eval.answer_scores import (
    best_over,
    contains,
    exact_match,
    normalise,
    references,
    strip_citations,
    token_f1,
)


def test_normalise_is_squad_normalize_answer() -> None:
    assert normalise("The  Eiffel-Tower!") == "eiffeltower"
    assert normalise("An Apple a day") == "apple day"


def test_exact_match_and_f1() -> None:
    assert exact_match("the Beatles", "Beatles") == 1.0
    assert exact_match("Beatles band", "Beatles") == 0.0
    assert token_f1("Beatles band", "the Beatles") == pytest.approx(2 / 3)
    assert token_f1("nothing shared", "Beatles") == 0.0


def test_yes_no_only_match_exactly() -> None:
    assert token_f1("no", "no") == 1.0
    assert token_f1("no, it is not in Paris", "no") == 0.0
    assert token_f1("yes", "no") == 0.0


def test_contains_on_word_boundaries() -> None:
    assert contains("Maximum Overdrive was directed by Stephen King.", "Stephen King") == 1.0
    assert contains("It is not known.", "no") == 0.0
    assert contains("anything", "") == 0.0


def test_citations_are_not_answer_text() -> None:
    assert strip_citations("Latin [hotpotqa-67996d24dadf]").strip() == "Latin"
    assert best_over(exact_match, "Latin [2][3]", ("Latin",)) == 1.0
    assert best_over(exact_match, "Latin", ()) == 0.0


def test_references_collect_answer_and_aliases() -> None:
    question = {"answer": "NYC", "answer_aliases": ["New York City", "NYC"]}
    assert references(question) == ("NYC", "New York City")
    assert references({"answer": "x", "metadata": {"answer_aliases": ["y"]}}) == ("x", "y")
    assert references({"question": "no answer"}) == ()
