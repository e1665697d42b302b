"""Scoring of questions nothing answers and of answers that say so (services/eval/abstention.py)
and the figures built on it: retrieval over questions with gold documents, answers over the
answerable ones, the majority baseline and yes/no accuracy."""

from __future__ import annotations

from services.eval.abstention import abstains, abstention_scores, majority, unanswerable
from services.eval.metrics import QuestionResult, summarise


def test_unanswerable_from_the_sets_own_markers() -> None:
    assert unanswerable({"answer": "", "metadata": {"answerable": False}})  # TimeQA
    assert unanswerable({"answer": "Insufficient information."})  # MultiHop-RAG null
    assert unanswerable({"answer": ""})
    assert not unanswerable({"answer": "George Peter", "metadata": {"answerable": True}})
    assert not unanswerable({"answer": "no"})  # a yes/no answer is an answer


def test_abstains_on_empty_or_said_or_flagged() -> None:
    assert abstains("")
    assert abstains("  [timeqa-1] ")  # only a citation
    assert abstains("Insufficient information.")
    assert abstains("I don't know.")
    assert abstains("Paris", flagged=True)
    assert not abstains("Paris")
    assert not abstains("I don't know Paris well, but it is in France.")


def test_abstention_scores() -> None:
    # (unanswerable, abstained): 2 of 3 unanswerable caught, 1 of 3 answerable wrongly.
    pairs = [
        (True, True),
        (True, True),
        (True, False),
        (False, True),
        (False, False),
        (False, False),
    ]
    scores = abstention_scores(pairs)
    assert scores == {
        "unanswerable": 3,
        "abstained": 3,
        "abstain_recall": round(2 / 3, 4),
        "abstain_precision": round(2 / 3, 4),
        "abstain_wrong": round(1 / 3, 4),
    }
    none = abstention_scores([(False, False)])
    assert none["abstain_recall"] is None
    assert none["abstain_precision"] is None
    assert none["abstain_wrong"] == 0.0


def test_majority_answer_and_share() -> None:
    assert majority(["Yes", "no", "yes.", "No", "yes"]) == ("yes", 0.6)
    assert majority([]) == ("", 0.0)


def _result(
    qid: str, gold: set[str], answer: str, refs: tuple[str, ...], *, unanswerable: bool = False
) -> QuestionResult:
    return QuestionResult(
        qid, "t", ["a", "b"], frozenset(gold), 1.0, answer=answer, references=refs,
        unanswerable=unanswerable,
    )  # fmt: skip


def test_summary_keeps_null_questions_out_of_retrieval_and_answers() -> None:
    results = [
        _result("1", {"a"}, "yes", ("Yes",)),
        _result("2", {"b"}, "yes", ("No",)),
        _result("3", {"b"}, "Paris is big", ("Paris",)),
        # null: no gold, its reference is the no-answer wording; the system answered a span
        _result("4", set(), "Lyon", ("Insufficient information.",), unanswerable=True),
    ]
    s = summarise(results, k=10)
    assert s["n"] == 4
    assert s["n_gold"] == 3
    assert s["recall"] == 1.0  # the null question does not count as a miss
    assert s["mrr"] == round((1 + 0.5 + 0.5) / 3, 4)
    assert s["n_answerable"] == 3
    assert s["answer_contains"] == round(2 / 3, 4)  # "yes" for "No" is wrong
    assert (s["n_yes_no"], s["yes_no_accuracy"]) == (2, 0.5)
    assert (s["majority_answer"], s["majority_share"]) == ("yes", round(1 / 3, 4))
    assert (s["unanswerable"], s["abstained"], s["abstain_recall"]) == (1, 0, 0.0)
    assert s["abstain_precision"] is None
    assert s["abstain_wrong"] == 0.0
