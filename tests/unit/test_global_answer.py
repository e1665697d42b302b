"""The offline global answer reads as themes: the top communities' titles numbered, then the
first ones' summaries as support."""

from __future__ import annotations

from services.retrieval.answer import NO_ANSWER, extractive_global_answer
from services.retrieval.schemas import CommunityHit


def hit(community_id: int, title: str, summary: str) -> CommunityHit:
    return CommunityHit(
        id=community_id, level=0, title=title, summary=summary, rating=5.0, size=4, score=0.5
    )


def test_global_answer_lists_the_themes_then_the_supporting_summaries() -> None:
    hits = [
        hit(1, "Science fiction, book award and publisher", "Themes: science fiction. Facts."),
        hit(2, "Opera and soprano", "Themes: opera. More facts."),
        hit(3, "Empty", "  "),  # nothing to support it: left out
        hit(4, "Federal election and senator", "Themes: federal election."),
        hit(5, "Guitar and country singles chart", "Themes: guitar."),
        hit(6, "Opera and soprano", "Themes: opera. Read from the same passages as 2."),
    ]
    lines = extractive_global_answer(hits).splitlines()
    assert lines[0] == (
        "The documents are mainly about: 1) Science fiction, book award and publisher "
        "[community 1]; 2) Opera and soprano [communities 2, 6]; 3) Federal election and "
        "senator [community 4]; 4) Guitar and country singles chart [community 5]."
    )
    assert lines[1:] == [
        "Science fiction, book award and publisher: Themes: science fiction. Facts. [community 1]",
        "Opera and soprano: Themes: opera. More facts. [community 2]",
        "Federal election and senator: Themes: federal election. [community 4]",
    ]


def test_global_answer_without_summaries() -> None:
    assert extractive_global_answer([hit(1, "Empty", "")]) == NO_ANSWER
