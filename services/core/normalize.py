"""Text normalisation: entity names (the first, exact-match step of entity resolution) and
answers (SQuAD's normalize_answer, shared by the offline answer and the eval's scoring)."""

from __future__ import annotations

import re
import string
import unicodedata

# Word-final corporate designators; "s.a." and "n.v." arrive here without their dots.
_CORPORATE_SUFFIXES = frozenset(
    {
        "inc", "incorporated", "corp", "corporation", "ltd", "limited", "llc", "llp",
        "plc", "co", "gmbh", "ag", "sa", "nv", "bv", "pty", "lp",
    }
)  # fmt: skip
_ARTICLES = frozenset({"the", "a", "an"})

_POSSESSIVE_RE = re.compile(r"(?<=\w)['’]s\b")
# Dots and apostrophes join ("U.S." -> "us", "O'Brien" -> "obrien"); other punctuation splits.
_JOINERS_RE = re.compile(r"[.'’`´]")
_SPACE_RE = re.compile(r"\s+")
# Below U+0250 are the Latin blocks, where accents are dropped; combining marks in other
# scripts (Japanese dakuten, Devanagari signs) change the letter, so they stay.
_LATIN_LIMIT = 0x0250


def _strip_latin_accents(text: str) -> str:
    out: list[str] = []
    prev_latin = False
    for ch in unicodedata.normalize("NFD", text):
        if unicodedata.category(ch) == "Mn":
            if prev_latin:
                continue
        else:
            prev_latin = ord(ch) < _LATIN_LIMIT
        out.append(ch)
    return unicodedata.normalize("NFC", "".join(out))


def entity_key(name: str) -> str:
    """Normalised key for an entity name.

    NFKC + casefold, Latin accents removed, possessive 's dropped, punctuation removed,
    whitespace collapsed, a leading article (the/a/an) and trailing corporate suffixes
    (inc, corp, ltd, llc, plc, co, gmbh, s.a., ...) dropped. Never empty for a name that
    contains a letter or digit. Deterministic.
    """
    text = unicodedata.normalize("NFKC", name).casefold()
    text = _strip_latin_accents(text)
    text = _POSSESSIVE_RE.sub("", text)
    text = text.replace("&", " and ")
    text = _JOINERS_RE.sub("", text)
    # By category, not by regex \w: combining marks (Devanagari vowel signs) are not \w.
    text = "".join(" " if unicodedata.category(ch)[0] in "PS" else ch for ch in text)
    words = _SPACE_RE.sub(" ", text).strip().split(" ")
    words = [w for w in words if w]

    if len(words) > 1 and words[0] in _ARTICLES:
        words = words[1:]
    while len(words) > 1 and words[-1] in _CORPORATE_SUFFIXES:
        words = words[:-1]
        # "Smith & Co." leaves a dangling "and".
        if len(words) > 1 and words[-1] == "and":
            words = words[:-1]

    key = " ".join(words)
    if key:
        return key
    # Nothing alphanumeric survived (e.g. a name made only of symbols): stay deterministic.
    return _SPACE_RE.sub(" ", unicodedata.normalize("NFKC", name).casefold()).strip()


_ANSWER_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def answer_key(text: str) -> str:
    """SQuAD's normalize_answer: lower case, no punctuation, no articles, single spaces."""
    lowered = text.lower().translate(_PUNCTUATION)
    return " ".join(_ANSWER_ARTICLES_RE.sub(" ", lowered).split())
