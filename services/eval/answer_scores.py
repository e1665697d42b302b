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


def exact_items(answer: str, expected: Any) -> tuple[float, float] | None:
    """(precision, recall) of a graph answer against an exact expected answer (issue 33's
    corpus, ``answer_set``): a count (an integer: both 1.0 when the answer is that number, else
    0), a set of names (the answer's items, "; " between them), or a comparison ({"shared",
    "only_a", "only_b"}: the pairs (part, name) of the answer's "shared: ... | only A: ... |
    only B: ..." parts, a neighbour written "TYPE direction: Name"); None when there is none."""
    text = strip_citations(answer).strip()
    if isinstance(expected, bool) or expected is None:
        return None
    if isinstance(expected, int):
        head = text.split()[0] if text.split() else ""
        hit = float(head.isdigit() and int(head) == expected)
        return hit, hit
    if isinstance(expected, Mapping):
        want = {
            (part, normalise(n))
            for part in ("shared", "only_a", "only_b")
            for n in expected.get(part, ())
        }
        got = set()
        for part, said in zip(("shared", "only_a", "only_b"), text.split(" | "), strict=False):
            names = said.partition(": ")[2]
            got |= {
                (part, normalise(n.rpartition(": ")[2]))
                for n in names.split("; ")
                if n and n != "nothing"
            }
        return _overlap(got, want)
    if isinstance(expected, Iterable) and not isinstance(expected, str):
        return _overlap(
            {normalise(n) for n in text.split("; ") if n}, {normalise(str(n)) for n in expected}
        )
    return None


def _overlap(got: set[Any], want: set[Any]) -> tuple[float, float]:
    if not got or not want:
        return float(got == want), float(got == want)
    same = len(got & want)
    return same / len(got), same / len(want)
