"""What a community's passages are about: keyphrases weighted against the rest of the corpus,
class-based TF-IDF as in BERTopic's c-TF-IDF (docs/retrieval.md, "Global answers offline").

A term is a phrase of one to three content words ending a run of words that no stop word,
number, capitalised word, adverb (-ly) or punctuation mark breaks, and that neither starts nor
ends with a verb form (-ed, -ing): the tails of noun phrases, guessed without a tagger. Capitalised
words are left out on purpose: they are the names the old titles listed; themes are what the
passages say about them ("science fiction novel", "publisher"). The weight of term t for
community c is

    w(t, c) = tf(t, c) * log(1 + A / f(t))

tf: the term's count in the community's passages; A: the average number of terms per community
of the level; f(t): the term's count over all communities of the level. Pure functions; the
counts come in, weights and titles go out.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

MAX_WORDS = 3  # longest phrase
TITLE_PHRASES = 3  # a title names at most this many keyphrases
# A longer phrase takes the place of a shorter one inside it when it occurs at least this share
# as often in the community's passages ("science fiction" for "fiction" when 2 of 3 "fiction"
# are "science fiction"): the same theme, said more precisely.
SPECIFIC_SHARE = 0.5

# Frequent Wikipedia verbs and fillers spaCy's list lacks; the weighting mutes other common words.
_MORE_STOPS = (
    "'s ’s known born including starring featuring located called named released founded "
    "served played appeared became following according based used later like written took won "
    "led held wrote began ran etc amid despite"
)
# -ly words that are nouns, not adverbs.
_LY_NOUNS = frozenset(
    ["family", "assembly", "supply", "monopoly", "anomaly", "ally", "rally", "belly", "lily"]
)
_CLAUSE = re.compile(r"[^\w\s'’-]+|\s[-'’]+\s")  # punctuation ends a run of content words
_WORD = re.compile(r"[^\W_]+(?:[-'’][^\W_]+)*")


@functools.cache
def stop_words() -> frozenset[str]:
    """spaCy's English stop words (its language data only: no model is loaded)."""
    from spacy.lang.en.stop_words import STOP_WORDS  # noqa: PLC0415 - 1 s import, on first use

    return frozenset(STOP_WORDS) | frozenset(_MORE_STOPS.split())


def terms(text: str) -> Counter[str]:
    """Counts of the candidate phrases (lower case) of one text."""
    stops = stop_words()
    counts: Counter[str] = Counter()
    for clause in _CLAUSE.split(text):
        run: list[str] = []
        for word in [*_WORD.findall(clause), ""]:  # "" flushes the last run
            if _content(word, stops):
                run.append(word.lower())
                continue
            # English noun phrases end in their noun: only a run's tails are phrases, so a
            # modifier ("experimental" in "experimental film") is never a theme on its own.
            if run and not _verb_form(run[-1]):
                for start in range(max(0, len(run) - MAX_WORDS), len(run)):
                    if not _verb_form(run[start]):
                        counts[" ".join(run[start:])] += 1
            run = []
    return counts


def _content(word: str, stops: frozenset[str]) -> bool:
    """A lower-case word that may be part of a phrase."""
    if len(word) < 3 or not word[0].islower() or word in stops:
        return False
    return not (word.endswith("ly") and len(word) > 4 and word not in _LY_NOUNS)


def _verb_form(word: str) -> bool:
    """A past participle or gerund, which ends no noun phrase ("located", "starring")."""
    if len(word) <= 4:
        return False
    return (word.endswith("ed") and not word.endswith("eed")) or (
        word.endswith("ing") and len(word) > 5
    )


@dataclass(frozen=True)
class Corpus:
    """The level's term statistics, A and f(t) of the formula. When only some communities'
    passages are read (a recompute writes only the changed ones), f(t)/A is estimated from a
    sample of the corpus: with T terms in C communities, A = T / C and f(t) = T * p(t), so
    A / f(t) = 1 / (C * p(t)), p(t) being the term's share of the sample's terms."""

    counts: Mapping[str, int]  # term -> count in the sample
    total: int  # terms in the sample
    communities: int  # C: communities of the level

    @classmethod
    def of(cls, texts: Iterable[str], communities: int) -> Corpus:
        """The statistics of a sample of passages for a level of ``communities`` communities."""
        return cls.of_counts((terms(text) for text in texts), communities)

    @classmethod
    def of_counts(cls, counted: Iterable[Mapping[str, int]], communities: int) -> Corpus:
        """As ``of``, from each passage's ``terms``."""
        counts: Counter[str] = Counter()
        for one in counted:
            counts.update(one)
        return cls(counts, sum(counts.values()), max(communities, 1))

    def idf(self, term: str, own: int) -> float:
        """log(1 + A / f(t)); ``own`` (the community's count) bounds the sample's from below,
        so a term the sample missed is not infinitely rare."""
        share = max(self.counts.get(term, 0), own) / max(self.total, own, 1)
        return math.log1p(1.0 / (self.communities * share))


def weights(counts: Mapping[str, int], corpus: Corpus) -> dict[str, float]:
    """c-TF-IDF weight of every term of one community."""
    return {t: tf * corpus.idf(t, tf) for t, tf in counts.items()}


def keyphrases(counts: Mapping[str, int], corpus: Corpus, limit: int) -> list[str]:
    """The community's ``limit`` best keyphrases, heaviest first (ties: more words, then
    alphabetical), no two sharing a word (plurals folded): a chosen phrase gives way to a longer
    one containing it that occurs at least SPECIFIC_SHARE as often; any other phrase sharing a
    word with a chosen one is skipped."""
    weighted = weights(counts, corpus)
    ranked = sorted(weighted, key=lambda t: (-weighted[t], -t.count(" "), t))
    chosen: list[str] = []
    for term in ranked:
        if len(chosen) == limit:
            break
        overlapping = [c for c in chosen if _words(c) & _words(term)]
        if not overlapping:
            chosen.append(term)
        elif all(
            _contains(term, c) and counts[term] >= SPECIFIC_SHARE * counts[c] for c in overlapping
        ):
            first = chosen.index(overlapping[0])
            chosen = [c for c in chosen if c not in overlapping]
            chosen.insert(first, term)
    return chosen


def theme_title(phrases: Sequence[str]) -> str:
    """The phrases joined and capitalised: "Science fiction novel, book awards and publisher"."""
    if not phrases:
        return ""
    joined = phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]
    return joined[0].upper() + joined[1:]


def _words(phrase: str) -> set[str]:
    return {w.removesuffix("s") for w in phrase.split()}


def _contains(longer: str, shorter: str) -> bool:
    return longer != shorter and f" {shorter} " in f" {longer} "
