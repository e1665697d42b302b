"""Answer quality against a reference answer and its aliases (pure): SQuAD-normalised exact
match and token F1 (the official HotpotQA / MuSiQue scoring), and "the reference is contained in
the returned answer" (what an extractive answer that quotes a sentence can earn).

Source citations in the answer (``[hotpotqa-…]``, ``[2]``, ``[community 7]``) are removed before
scoring: they are provenance, not answer text."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from services.core.normalize import answer_key

_CITATION = re.compile(r"\[[^\[\]]*\]")


def strip_citations(answer: str) -> str:
    """The answer without bracketed source citations."""
    return _CITATION.sub(" ", answer)


normalise = answer_key  # SQuAD's normalize_answer (services/core/normalize.py)


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when the normalised strings are equal."""
    return float(normalise(prediction) == normalise(reference))


def token_f1(prediction: str, reference: str) -> float:
    """Token-level F1 of the normalised strings. As in the HotpotQA scorer, a yes/no/noanswer
    reference only matches itself exactly (a sentence that happens to contain "no" is not
    half right)."""
    pred, ref = normalise(prediction), normalise(reference)
    if ref in ("yes", "no", "noanswer") or pred in ("yes", "no", "noanswer"):
        return float(pred == ref)
    common = Counter(pred.split()) & Counter(ref.split())
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred.split()), same / len(ref.split())
    return 2 * precision * recall / (precision + recall)


def contains(prediction: str, reference: str) -> float:
    """1.0 when the normalised reference occurs in the normalised prediction on word
    boundaries ("no" is not found in "not"); an empty reference is never contained."""
    ref = normalise(reference)
    if not ref:
        return 0.0
    return float(f" {ref} " in f" {normalise(prediction)} ")


def references(question: Mapping[str, Any]) -> tuple[str, ...]:
    """The reference answer and its aliases (``answer_aliases`` at the top level, as MuSiQue
    has it, or under ``metadata``); empty when the question has no answer."""
    meta = question.get("metadata") or {}
    found: list[str] = []
    for value in (
        question.get("answer"),
        question.get("answer_aliases"),
        meta.get("answer_aliases"),
    ):
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, Iterable):
            found.extend(str(v) for v in value if isinstance(v, str))
    return tuple(dict.fromkeys(a for a in found if a.strip()))


def best_over(score: Callable[[str, str], float], prediction: str, refs: Sequence[str]) -> float:
    """The best score of the prediction against any reference (0 without references)."""
    cleaned = strip_citations(prediction)
    return max((score(cleaned, r) for r in refs), default=0.0)
