"""Grounding a question's named sources (services/retrieval/facets.py): a value's forms, the
longest match, one facet (the most values named), capitalised names only, never a function
word, each tenant's values for its callers, keys a filter can name."""

from __future__ import annotations

from services.core.access import Caller
from services.retrieval.facets import Vocabulary, forms

SOURCES = [
    "The Verge",
    "TechCrunch",
    "Cnbc | World Business News Leader",
    "FOX News - Health",
    "FOX News - Lifestyle",
    "The New York Times",
    "Times of India",
]
VOCABULARY = Vocabulary.of(
    [(None, "source", s, len(SOURCES)) for s in SOURCES]
    + [(None, "author", a, 180) for a in ("Megan Grey", "Nell Geraets", "What")]
    + [("t2", "source", "Kadalu Times", 9), (None, "og.site", "The Verge", 3)]
)


def _named(question: str, caller: Caller | None = None) -> dict[str, object] | None:
    found = VOCABULARY.ground(question, caller or Caller())
    return None if found is None else dict(found.filters.metadata)


def test_forms_drop_taglines_sections_and_a_leading_the() -> None:
    assert forms("Cnbc | World Business News Leader") == {
        "Cnbc | World Business News Leader",
        "Cnbc",
    }
    assert forms("FOX News - Health") == {"FOX News - Health", "FOX News"}
    assert forms("The New York Times") == {"The New York Times", "New York Times"}
    assert forms("technology") == set()  # not a name
    assert forms("AI") == set()  # too short to tell


def test_named_sources_become_any_of_one_field() -> None:
    assert _named("Does 'The Verge' article agree with TechCrunch?") == {
        "source": ["TechCrunch", "The Verge"]
    }
    assert _named("What did Cnbc report?") == {"source": ["Cnbc | World Business News Leader"]}
    assert _named("What did FOX News say?") == {
        "source": ["FOX News - Health", "FOX News - Lifestyle"]
    }


def test_a_form_inside_a_longer_one_does_not_count() -> None:
    assert _named("In the New York Times report, ...") == {"source": ["The New York Times"]}
    assert _named("A Times of India story") == {"source": ["Times of India"]}


def test_case_and_word_boundaries() -> None:
    assert _named("the verge of a breakdown") is None
    assert _named("TechCrunchy snacks") is None


def test_the_field_with_most_named_values_wins() -> None:
    # A name that is an author and sources named too: the sources (two values) ground it.
    question = "According to Megan Grey in The Verge and TechCrunch, ..."
    assert _named(question) == {"source": ["TechCrunch", "The Verge"]}
    assert _named("What did Megan Grey write?") == {"author": ["Megan Grey"]}


def test_function_words_name_nothing() -> None:
    assert forms("What") == set()
    assert _named("What did Apple say?") is None  # an author called "What" steers nothing


def test_each_tenant_grounds_to_its_own_values() -> None:
    assert _named("What did the Kadalu Times say?") is None  # t2's value, an untenanted caller
    assert _named("What did the Kadalu Times say?", Caller(tenant="t2")) == {
        "source": ["Kadalu Times"]
    }
    assert _named("What did the Kadalu Times say?", Caller.operator()) == {
        "source": ["Kadalu Times"]
    }


def test_the_note_names_the_questions_words_not_the_values() -> None:
    found = VOCABULARY.ground("What did FOX News say?", Caller())
    assert found is not None
    assert found.describe() == "source named 'FOX News'"


def test_keys_a_filter_reads_as_paths_are_left_out() -> None:
    assert "og.site" not in VOCABULARY.visible_to(Caller())


def test_sources_the_collection_does_not_hold() -> None:
    ask = VOCABULARY.unknown_sources
    anyone = Caller()
    assert ask("Considering a Bloomberg article and a report by Reuters on Mexico?", anyone) == [
        "Bloomberg",
        "Reuters",
    ]
    assert ask("What did an article by The Verge and another by Forbes say?", anyone) == ["Forbes"]
    assert ask("What was published by The Wall Street Journal?", anyone) == [
        "The Wall Street Journal"
    ]
    # Held sources, their sections and their heads are not unknown; nor are possessives,
    # months, people "according to" whom, or a tenant without facets.
    assert ask("Did the FOX News - Health article and the Cnbc report agree?", anyone) == []
    assert ask("Did the TechCrunch report on Spill's platform differ?", anyone) == []
    assert ask("What did the October report by TechCrunch say?", anyone) == []
    assert ask("Which company, according to Eddy Cue, pays?", anyone) == []
    assert ask("What did a Bloomberg article say?", Caller(tenant="t9")) == []


def test_codes_say_nothing_about_which_sources_exist() -> None:
    codes = Vocabulary.of([(None, "property", p, 3) for p in ("P466", "P54", "P108")])
    question = "What was the Greenbelt News review called from Nov 1937 to Jul 1954?"
    assert codes.unknown_sources(question, Caller()) == []  # "P466" is no name in words
    worded = VOCABULARY.unknown_sources
    assert worded(question, Caller()) == ["Greenbelt News"]  # ("Nov" is a month)
    # A word for writing inside a longer word is not one ("post-impressionist").
    assert worded("Where did the Russian post-impressionist painter work?", Caller()) == []
