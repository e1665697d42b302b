"""Questions nothing answers, and answers that say so (pure).

A question is unanswerable when its set says so (``metadata.answerable: false``, TimeQA) or its
reference is the set's "no answer" wording (MultiHop-RAG's "Insufficient information.") or
empty. An answer abstains when it is empty once citations are removed, or says it does not know
in one of the wordings below (the query service's own and the sets'), or the response carries
``abstained: true``. Abstention is scored as a classifier of unanswerable questions: recall (of
the unanswerable, the share abstained on), precision (of the abstentions, the share that were
right) and the wrong-abstention rate on answerable questions.

Also the majority baseline of a group of questions: its most frequent reference answer and that
answer's share, the score a system that always gives it would get (what "better than chance"
means for yes/no and comparison questions)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from services.eval.answer_scores import normalise, strip_citations

# Normalised wordings of "no answer": the sets' references and what an answer may say.
NO_ANSWER = frozenset(
    {
        "",
        "insufficient information",
        "noanswer",
        "no answer",
        "unanswerable",
        "i dont know",
        "i do not know",
        "unknown",
    }
)


def unanswerable(question: Mapping[str, Any]) -> bool:
    """Whether the question's set says nothing answers it."""
    meta = question.get("metadata") or {}
    if meta.get("answerable") is False:
        return True
    answer = question.get("answer")
    return isinstance(answer, str) and normalise(answer) in NO_ANSWER


def abstains(answer: str, flagged: bool = False) -> bool:
    """Whether an answer says it does not know (``flagged``: the response said so itself)."""
    return flagged or normalise(strip_citations(answer)) in NO_ANSWER


def abstention_scores(pairs: Iterable[tuple[bool, bool]]) -> dict[str, Any]:
    """Over (unanswerable, abstained) pairs: {"unanswerable": n, "abstained": n, "abstain_recall",
    "abstain_precision", "abstain_wrong"} (a rate is None where its denominator is 0)."""
    pairs = list(pairs)
    unans = [abst for un, abst in pairs if un]
    ans = [abst for un, abst in pairs if not un]
    abstained = [un for un, abst in pairs if abst]

    def rate(xs: Sequence[bool]) -> float | None:
        return round(sum(xs) / len(xs), 4) if xs else None

    return {
        "unanswerable": len(unans),
        "abstained": len(abstained),
        "abstain_recall": rate(unans),
        "abstain_precision": rate(abstained),
        "abstain_wrong": rate(ans),
    }


def majority(answers: Iterable[str]) -> tuple[str, float]:
    """The most frequent normalised answer and its share ("", 0.0 for none); ties go to the
    answer seen first."""
    keys = [normalise(a) for a in answers]
    if not keys:
        return "", 0.0
    top, count = Counter(keys).most_common(1)[0]
    return top, round(count / len(keys), 4)
