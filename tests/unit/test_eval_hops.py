"""`kgstream eval` by hop count: each hop's gold rank, the by-hops groups and their printing."""

from __future__ import annotations

from services.cli.evaluate import table
from services.eval.metrics import QuestionResult, hop_ranks, mode_report, question_row
from services.eval.runner import hop_gold_ids

ABC = ("a", "b", "c")
# Two 3-hop questions (hop ranks 1, 3, 7 and 2, 1, absent), one 2-hop one (7, 1), a HotpotQA
# one without a decomposition, and a 4-hop one whose hops 1 and 3 share a passage.
RESULTS = [
    QuestionResult(
        "q1", "3hop1", ["a", "x", "b", "y", "z", "w", "c"], frozenset(ABC), 1.0,
        hop_gold=ABC, num_hops=3,
    ),
    QuestionResult("q2", "3hop1", ["b", "a"], frozenset(ABC), 1.0, hop_gold=ABC, num_hops=3),
    QuestionResult(
        "q3", "2hop", ["e", "x", "y", "z", "w", "v", "d"], frozenset({"d", "e"}), 1.0,
        answer="Paris", references=("Paris",), hop_gold=("d", "e"), num_hops=2,
    ),
    QuestionResult(
        "q4", "bridge", ["a", "b"], frozenset({"a", "b"}), 1.0, answer="Lyon",
        references=("Paris",),
    ),
    QuestionResult(
        "q5", "4hop1", ["g", "h"], frozenset({"f", "g", "h"}), 1.0,
        hop_gold=("f", "g", "f", "h"), num_hops=4,
    ),
]  # fmt: skip


def test_hop_ranks_in_hop_order() -> None:
    assert hop_ranks(["b", "a"], ABC, 10) == [2, 1, None]
    assert hop_ranks(["b", "a"], ABC, 1) == [None, 1, None]  # only the first k count
    assert hop_ranks(["b", "a"], (), 10) == []


def test_per_hop_ranks_by_hop_count() -> None:
    ranks = mode_report(RESULTS, k=10)["hop_ranks"]
    assert list(ranks) == ["2", "3", "4"]  # q4 has no hop order: left out
    assert ranks["3"] == [
        {"hop": 1, "in_k": 1.0, "in_5": 1.0, "mean_rank": 1.5, "n": 2},
        {"hop": 2, "in_k": 1.0, "in_5": 1.0, "mean_rank": 2.0, "n": 2},
        # ranks 7 and absent (k + 1 = 11): the last hop is the one lost
        {"hop": 3, "in_k": 0.5, "in_5": 0.0, "mean_rank": 9.0, "n": 2},
    ]
    assert ranks["2"] == [
        {"hop": 1, "in_k": 1.0, "in_5": 0.0, "mean_rank": 7.0, "n": 1},
        {"hop": 2, "in_k": 1.0, "in_5": 1.0, "mean_rank": 1.0, "n": 1},
    ]
    assert [(c["in_k"], c["mean_rank"]) for c in ranks["4"]] == [
        (0.0, 11.0),
        (1.0, 1.0),
        (0.0, 11.0),
        (1.0, 2.0),
    ]
    # with k = 5 a rank of 7 is absent too
    assert mode_report(RESULTS, k=5)["hop_ranks"]["3"][2]["mean_rank"] == 6.0  # (6 + 6) / 2


def test_by_hops_groups_by_stated_hop_count_else_gold_documents() -> None:
    report = mode_report(RESULTS, k=10)
    assert {h: s["n"] for h, s in report["by_hops"].items()} == {"2": 2, "3": 2, "4": 1}
    assert {g: s["n"] for g, s in report["by_gold"].items()} == {"2": 2, "3": 3}
    # answers by hop count: q3 is exact, q4 is not; q1, q2 and q5 have no reference
    assert report["by_hops"]["2"]["answer_em"] == 0.5
    assert report["by_hops"]["2"]["answer_contains"] == 0.5
    assert report["by_hops"]["2"]["all_gold"] == 1.0
    assert report["by_hops"]["3"]["all_gold"] == 0.5


def test_details_rows_carry_each_hops_rank() -> None:
    row = question_row(RESULTS[1], 10)
    assert (row["hops"], row["hop_gold_doc_ids"], row["hop_ranks"]) == (3, list(ABC), [2, 1, None])
    hotpot = question_row(RESULTS[3], 10)
    assert (hotpot["hops"], hotpot["hop_gold_doc_ids"], hotpot["hop_ranks"]) == (2, [], [])


def test_table_prints_hops_and_hop_ranks() -> None:
    lines = table({"k": 10, "modes": {"local": mode_report(RESULTS, k=10)}}).splitlines()
    head = "hop ranks (in top 10 / top 5 / mean rank, 11 when absent)"
    rows = lines[: lines.index(head)]
    kinds = [line[9:20].strip() for line in rows if line.startswith("local    ")]
    by_type = ["overall", "2hop", "3hop1", "4hop1", "bridge"]
    # q5 makes the gold-document groups differ from the hop counts: both are printed
    assert kinds == [*by_type, "2 hops", "3 hops", "4 hops", "2 gold", "3 gold"]
    assert "local    3 hops   hop1 1.00/1.00/1.5  hop2 1.00/1.00/2.0  hop3 .50/.00/9.0" in lines
    assert "local    2 hops   hop1 1.00/.00/7.0  hop2 1.00/1.00/1.0" in lines


def test_table_without_hop_decompositions() -> None:
    hotpot = [r for r in RESULTS if not r.hop_gold]
    lines = table({"k": 10, "modes": {"vector": mode_report(hotpot, k=10)}}).splitlines()
    kinds = [line[9:20].strip() for line in lines if line.startswith("vector   ")]
    assert kinds == ["overall", "bridge", "2 hops"]  # "2 gold" is the same group: not repeated
    assert not any(line.startswith("hop ranks") for line in lines)


def test_hop_gold_ids_from_the_decomposition() -> None:
    steps = [{"question": "q", "gold_doc_id": "m-1"}, {"question": "#1 q", "gold_doc_id": "m-2"}]
    assert hop_gold_ids({"metadata": {"decomposition": steps}}) == ("m-1", "m-2")
    assert hop_gold_ids({"metadata": {"dataset": "hotpotqa"}}) == ()
    assert hop_gold_ids({}) == ()
    # a hop without its gold passage: no order is guessed
    assert hop_gold_ids({"metadata": {"decomposition": [steps[0], {"question": "x"}]}}) == ()
