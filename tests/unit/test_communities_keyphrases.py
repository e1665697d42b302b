"""Community themes offline: candidate phrases, the class-based TF-IDF weight (checked against
hand-computed values), the choice of keyphrases and the title they make."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from services.communities.keyphrases import Corpus, keyphrases, terms, theme_title, weights


def test_terms_are_noun_phrase_tails_of_lower_case_content_words() -> None:
    counted = terms("The science fiction novel was published by Tor Books in 2010.")
    # stop words, the verb form, the names and the year end the phrase or are dropped; the
    # modifiers alone ("science", "science fiction") are not phrases
    assert counted == Counter({"novel": 1, "fiction novel": 1, "science fiction novel": 1})


def test_punctuation_and_adverbs_end_a_phrase() -> None:
    assert set(terms("famous guitarist, country singer; widely acclaimed")) == {
        "guitarist",
        "famous guitarist",
        "singer",
        "country singer",
    }


def test_c_tf_idf_weight_by_hand() -> None:
    # Two communities at the level, their passages are the whole sample:
    #   c1: "novel, award, novel" -> novel 2, award 1; c2: "novel, film, film" -> novel 1,
    #   film 2 (the commas keep out two-word phrases).
    # T = 6 terms, C = 2, A = T / C = 3; f(novel) = 3, f(award) = 1, f(film) = 2.
    corpus = Corpus.of(["novel, award, novel", "novel, film, film"], communities=2)
    assert (corpus.total, corpus.communities) == (6, 2)
    c1 = weights(terms("novel, award, novel"), corpus)
    assert c1["novel"] == pytest.approx(2 * math.log(1 + 3 / 3))  # 1.386
    assert c1["award"] == pytest.approx(1 * math.log(1 + 3 / 1))  # 1.386
    c2 = weights(terms("novel, film, film"), corpus)
    assert c2["film"] == pytest.approx(2 * math.log(1 + 3 / 2))  # 1.833
    assert c2["novel"] == pytest.approx(math.log(2))  # 0.693: the word both share weighs least


def test_a_sample_stands_for_the_level_by_its_term_shares() -> None:
    # 10 sampled terms, novel 4 of them, for a level of 5 communities: A / f = 1 / (C * p)
    corpus = Corpus({"novel": 4, "award": 1}, total=10, communities=5)
    assert weights({"novel": 2}, corpus)["novel"] == pytest.approx(2 * math.log(1 + 1 / 2))
    # a term the sample missed counts as often as in the community itself, not as never
    assert corpus.idf("opera", 3) == pytest.approx(math.log(1 + 1 / (5 * 0.3)))


def test_keyphrases_prefer_the_specific_phrase_and_do_not_repeat_words() -> None:
    corpus = Corpus({}, total=100, communities=4)  # every term as rare: the counts decide
    counts = {
        "fiction": 3,
        "science fiction": 2,  # 2 >= 0.5 * 3: replaces "fiction" where it stood
        "novel": 2,
        "novels": 1,  # the plural of a chosen word: skipped
        "award": 1,  # inside the chosen "book award": skipped
        "book award": 1,
        "publisher": 1,
    }
    assert keyphrases(counts, corpus, 4) == ["science fiction", "novel", "book award", "publisher"]
    assert keyphrases(counts, corpus, 2) == ["science fiction", "novel"]


def test_title_names_the_keyphrases() -> None:
    assert theme_title(["science fiction", "book award", "publisher"]) == (
        "Science fiction, book award and publisher"
    )
    assert theme_title(["opera"]) == "Opera"
    assert theme_title([]) == ""
