"""`kgstream eval` output: the per-mode tables for people (JSON is printed by the command)."""

from __future__ import annotations

from typing import Any


def table(report: dict[str, Any]) -> str:
    """One row per mode and question type, then per hop count ("3 hops"; per number of gold
    documents, "2 gold", only where that groups the questions otherwise), then the rank of each
    hop's gold document per hop count when the questions have a hop decomposition."""
    k = report["k"]
    head = (
        f"{'mode':<8} {'type':<11} {'R@2':>6} {'R@5':>6} {'R@' + str(k):>6} {'all@' + str(k):>7}"
        f" {'MRR':>6} {'last':>5} {'EM':>6} {'F1':>6} {'has':>6}"
        f" {'p50 ms':>8} {'p99 ms':>8} {'n':>4}"
    )
    lines = [head]
    for mode, rep in report["modes"].items():
        if "unavailable" in rep:
            lines.append(f"{mode:<8} unavailable: {rep['unavailable']}")
            continue
        hops = [(f"{h} hops", m) for h, m in rep.get("by_hops", {}).items()]
        gold = [(f"{g} gold", m) for g, m in rep.get("by_gold", {}).items()]
        if rep.get("by_gold") == rep.get("by_hops"):  # the same groups (every corpus so far): once
            gold = []
        rows = [("overall", rep["overall"]), *rep["by_type"].items(), *hops, *gold]
        for kind, m in rows:
            if m.get("n_gold", m["n"]):
                found = (
                    f"{m['recall_at_2']:>6.3f} {m['recall_at_5']:>6.3f} {m['recall']:>6.3f}"
                    f" {m['all_gold']:>7.3f} {m['mrr']:>6.3f} {m['last_gold_rank']:>5.2f}"
                )
            else:  # no gold documents (null questions): nothing to find
                found = f"{'-':>6} {'-':>6} {'-':>6} {'-':>7} {'-':>6} {'-':>5}"
            if m.get("n_answerable", m["n"]):
                said = f"{m['answer_em']:>6.3f} {m['answer_f1']:>6.3f} {m['answer_contains']:>6.3f}"
            else:  # only unanswerable questions: see the abstention block
                said = f"{'-':>6} {'-':>6} {'-':>6}"
            lines.append(
                f"{mode:<8} {kind:<11} {found} {said}"
                f" {m['p50_ms']:>8.1f} {m['p99_ms']:>8.1f} {m['n']:>4}"
            )
    lines += hop_rank_lines(report)
    lines += abstention_lines(report)
    lines += baseline_lines(report)
    for mode, rep in report["modes"].items():
        cost = rep.get("overall", {})
        if cost.get("llm_calls"):
            followups = cost.get("followup_tokens", 0)
            lines.append(
                f"{mode}: {cost['llm_calls']:.2f} LLM calls and {cost['llm_tokens']:.0f} tokens"
                " (prompt + completion) per question"
                + (f", {followups:.0f} of them in follow-up decisions" if followups else "")
            )
    lines.append(
        f"last: mean rank of the last gold document ({k + 1} when one is not in the first {k});"
        " EM / F1: SQuAD-normalised exact match and token F1; has: answer contains it"
    )
    return "\n".join(lines)


def _groups(rep: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [("overall", rep["overall"]), *rep["by_type"].items()]


def abstention_lines(report: dict[str, Any]) -> list[str]:
    """Per mode and question type with unanswerable questions (or abstentions): how often the
    answer said it did not know on them, how often an abstention was right, and how often it
    abstained on an answerable question."""
    lines = []
    for mode, rep in report["modes"].items():
        if "unavailable" in rep:
            continue
        for kind, m in _groups(rep):
            if not (m.get("unanswerable") or m.get("abstained")):
                continue
            lines.append(
                f"{mode:<8} {kind:<11} {rate(m['abstain_recall']):>7}"
                f" {rate(m['abstain_precision']):>9} {rate(m['abstain_wrong']):>7}"
                f" {m['unanswerable']:>6} {m['abstained']:>9}"
            )
    if lines:
        head = (
            f"{'mode':<8} {'type':<11} {'recall':>7} {'precision':>9} {'wrong':>7}"
            f" {'unans':>6} {'abstained':>9}"
        )
        lines[:0] = ["abstention (recall on unanswerable, precision, rate on answerable)", head]
    return lines


def baseline_lines(report: dict[str, Any]) -> list[str]:
    """Per mode and question type with yes/no questions: the accuracy on them beside the
    majority answer's share (what always giving that answer would score)."""
    lines = []
    for mode, rep in report["modes"].items():
        if "unavailable" in rep:
            continue
        for kind, m in _groups(rep):
            if not m.get("n_yes_no"):
                continue
            lines.append(
                f"{mode:<8} {kind:<11} yes/no {m['yes_no_accuracy']:.3f} (n {m['n_yes_no']});"
                f" answers EM {m['answer_em']:.3f} against the majority answer"
                f" '{m['majority_answer']}' {m['majority_share']:.3f} (n {m['n_answerable']})"
            )
    return lines


def rate(x: float | None) -> str:
    """A rate as 0.xxx, or "-" where it has no denominator."""
    return "-" if x is None else f"{x:.3f}"


def hop_rank_lines(report: dict[str, Any]) -> list[str]:
    """Per mode and hop count, each hop's gold document: share in the first k, share in the
    first 5, mean rank ("2 hops  hop1 .92/.85/2.1  hop2 .70/.55/5.3"); none without hops."""
    k = report["k"]
    lines = []
    for mode, rep in report["modes"].items():
        for h, per_hop in rep.get("hop_ranks", {}).items():
            cells = "  ".join(
                f"hop{c['hop']} {share(c['in_k'])}/{share(c['in_5'])}/{c['mean_rank']:.1f}"
                for c in per_hop
            )
            lines.append(f"{mode:<8} {h + ' hops':<8} {cells}")
    if lines:
        head = f"hop ranks (in top {k} / top {min(5, k)} / mean rank, {k + 1} when absent)"
        lines.insert(0, head)
    return lines


def share(x: float) -> str:
    """A share in [0, 1] as .92 (1.00 stays whole)."""
    return f"{x:.2f}".removeprefix("0")
