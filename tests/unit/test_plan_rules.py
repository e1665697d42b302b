"""Questions to typed graph plans by rule (services/retrieval/plan_rules.py): each shape of
seed 002's table, what the words say about direction, steps, negation and kind, and the
questions that state no plan (no name, or a graph of co-occurrences only)."""

from __future__ import annotations

import re

from services.retrieval.plan_rules import Said, plan_for
from services.retrieval.plans import Plan

TYPES = ("APPROVED", "LOCATED_IN", "PARTY_TO", "SUPPLIES")


def said(question: str, *names: str) -> list[Said]:
    """The names as the question says them, with their word positions."""
    words = re.findall(r"[\w'’-]+", question)
    out = []
    for name in names:
        n = len(name.split())
        start = next(i for i in range(len(words)) if " ".join(words[i : i + n]) == name)
        out.append(Said(name, start, start + n))
    return sorted(out, key=lambda s: s.start)


def plan(question: str, *names: str, types: tuple[str, ...] = TYPES) -> Plan | None:
    return plan_for(question, said(question, *names), types)


TYPED = ["(any typed)"]  # a step along any relationship type but co-occurrence


def steps(p: Plan | None) -> list[tuple[list[str], str, int]]:
    assert p is not None
    return [
        (s.relationships or TYPED if s.typed else s.relationships, s.direction, s.depth)
        for s in p.follow
    ]


def test_counts_and_lists_follow_the_relationship_word() -> None:
    p = plan("How many suppliers does Lumeris Assemblies have?", "Lumeris Assemblies")
    assert p is not None
    assert p.result.op == "count"
    assert steps(p) == [(["SUPPLIES"], "in", 1)]  # said before the name: what points at it
    p = plan("Which contracts is Wrenfield Assemblies party to?", "Wrenfield Assemblies")
    assert p is not None
    assert p.result.op == "list"
    assert steps(p) == [(["PARTY_TO"], "out", 1)]  # said after it: what it points at
    p = plan("Who approved Contract NC-7?", "Contract NC-7")
    assert steps(p) == [(["APPROVED"], "in", 1)]
    assert p is not None
    assert p.where is not None
    assert p.where.types == ["PERSON", "ORG", "NORP", "LANGUAGE"]


def test_a_chain_of_relationship_words_is_a_chain_of_steps() -> None:
    p = plan("Who approved the contracts that Calder Fleet is party to?", "Calder Fleet")
    assert steps(p) == [(["PARTY_TO"], "out", 1), (["APPROVED"], "in", 1)]
    p = plan("Who supplies the suppliers of Veltrix Assemblies?", "Veltrix Assemblies")
    assert steps(p) == [(["SUPPLIES"], "in", 1), (["SUPPLIES"], "in", 1)]


def test_membership_without_a_relationship_word() -> None:
    p = plan("How many companies are based in EMEA?", "EMEA")
    assert steps(p) == [(TYPED, "both", 1)]
    assert p is not None
    assert p.where is not None
    assert p.where.types == ["ORG"]


def test_impact_goes_downstream_as_far_as_asked() -> None:
    p = plan("What is affected if Corvath Systems goes bankrupt?", "Corvath Systems")
    assert steps(p) == [(TYPED, "out", 3)]
    assert p is not None
    assert p.where is not None
    assert p.where.like_start
    p = plan("Which companies are within two hops downstream of Kestrel if it fails?", "Kestrel")
    assert steps(p) == [(TYPED, "out", 2)]


def test_negation_drops_what_the_second_name_reaches() -> None:
    p = plan(
        "Which companies in the Americas are not supplied by Corvath Systems?",
        "Americas",
        "Corvath Systems",
    )
    assert p is not None
    assert p.exclude is not None
    assert (p.exclude.names, p.exclude.relationships, p.exclude.direction) == (
        ["Corvath Systems"],
        ["SUPPLIES"],
        "out",  # passive: what Corvath supplies
    )
    assert steps(p) == [(TYPED, "both", 1)]
    p = plan(
        "Which Americas companies does Kilnworth Components not supply?",
        "Americas",
        "Kilnworth Components",
    )
    assert p is not None
    assert p.exclude is not None
    assert p.exclude.direction == "out"


def test_rankings_and_comparisons() -> None:
    p = plan("Which vendor supplies the most manufacturers?")
    assert p is not None
    assert p.result.op == "rank"
    assert p.result.related is not None
    assert (p.start.types, p.result.related.relationships, p.result.related.direction) == (
        ["ORG"],
        ["SUPPLIES"],
        "out",
    )
    p = plan("Which APAC company is party to the most contracts?", "APAC")
    assert p is not None
    assert p.start.names == ["APAC"]
    assert steps(p) == [(TYPED, "both", 1)]
    p = plan(
        "Compare Norvale Components and Kestrel Alloys.", "Norvale Components", "Kestrel Alloys"
    )
    assert p is not None
    assert p.result.op == "compare"
    assert p.start.names == ["Norvale Components", "Kestrel Alloys"]
    p = plan("What do Norvale and Kestrel have in common?", "Norvale", "Kestrel")
    assert p is not None
    assert p.result.op == "compare"


def test_questions_that_state_no_plan() -> None:
    assert plan("Which film did Irwin Shaw write?", "Irwin Shaw", types=()) is None
    assert plan("What is the capital of France?", "France") is None  # no kind, no relationship
    assert plan("How many suppliers are there?") is None  # names nothing to start from


def test_what_makes_no_valid_plan_is_no_plan() -> None:
    """More relationship types than a step may list, a type the plan language cannot name, a
    name past the bound: no plan (the question goes on as before), never an error."""
    many = (*tuple(f"TYPE_{i}" for i in range(40)), "SUPPLIES")
    p = plan("How many companies are based in EMEA?", "EMEA", types=many)
    assert steps(p) == [(TYPED, "both", 1)]  # any typed: the types are not listed
    long_name = "Acme " * 60
    assert plan(f"How many suppliers does {long_name.strip()} have?", long_name.strip()) is None
    odd = ("supplies to",)  # not a type a plan can name
    assert plan("Who supplies Acme?", "Acme", types=odd) is None


def test_a_trade_said_by_its_converse_or_another_verb() -> None:
    """ "X buys from Y": Y supplies X (the converse, read reversed); "sell" says SUPPLIES in a
    graph that has no SELLS; a graph's own word wins over a sense."""
    p = plan("Who buys from Norvale Electronics?", "Norvale Electronics")
    assert steps(p) == [(["SUPPLIES"], "out", 1)]
    p = plan("What was bought by Norvale Electronics?", "Norvale Electronics")
    assert steps(p) == [(["SUPPLIES"], "in", 1)]  # passive and converse: Norvale is supplied
    p = plan("To how many companies does Norvale Electronics sell?", "Norvale Electronics")
    assert p is not None
    assert p.result.op == "count"  # "to how many" counts as "how many" does
    assert steps(p) == [(["SUPPLIES"], "out", 1)]
    own = ("SELLS_TO", "SUPPLIES")
    p = plan("Who sells to Norvale Electronics?", "Norvale Electronics", types=own)
    assert steps(p) == [(["SELLS_TO"], "in", 1)]


def test_what_is_said_to_be_absent_is_lacked() -> None:
    """ "No supplier": nothing supplies it (the role's relationship, from the other end), and the
    word is not also a step; "no contract": no typed relationship to a legal document."""
    p = plan("Which companies in EMEA have no supplier?", "EMEA")
    assert p is not None
    assert steps(p) == [(TYPED, "both", 1)]
    assert p.where is not None
    assert p.where.types == ["ORG"]
    assert p.where.lacks is not None
    assert (p.where.lacks.relationships, p.where.lacks.direction) == (["SUPPLIES"], "in")
    p = plan("Which APAC vendors have no contract?", "APAC")
    assert p is not None
    assert p.where is not None
    assert p.where.lacks is not None
    lacks = p.where.lacks
    assert (lacks.typed, lacks.direction, lacks.to_types) == (True, "both", ["LAW"])
    p = plan("Which companies without customers are in EMEA?", "EMEA")
    assert p is not None
    assert p.where is not None
    assert p.where.lacks is not None
    assert (p.where.lacks.relationships, p.where.lacks.direction) == (["SUPPLIES"], "out")
    # a graph with no trade relationship has no role to lack; a name is never what is absent
    assert plan("Which companies in EMEA have no supplier?", "EMEA", types=("LOCATED_IN",)) is None
    p = plan("Which companies are not supplied by Norvale Electronics?", "Norvale Electronics")
    assert p is None or p.where is None or p.where.lacks is None
