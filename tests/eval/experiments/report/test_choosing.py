"""The "Choosing a configuration" table: numbers read out of hand-made reports, known by hand, and the
the reproducing guide's table held equal to the committed reports'."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eval.experiments.report.choosing import choosing, markdown_table, rows

ROOT = Path(__file__).resolve().parents[4]


def _comparison(a, b, *, diff=0.0, pct=None, se=0.02, verdict="within noise", holm=None, **more):
    return {"a": a, "b": b, "diff": diff, "pct": pct, "se": se, "reference": 4.0, "verdict": verdict,
            "verdict_holm": holm or verdict, "metric": "val_loss", **more}


def _report(tpp: float, pct: float, exit_gain: float) -> dict:
    label = "ILD+DTS p_max=0.4"
    return {
        "model": {"shapes": [{"tokens_per_parameter": tpp, "n_layers": 12, "runs": 4},
                             {"tokens_per_parameter": tpp * 0.9, "n_layers": 12, "runs": 1}]},
        "configurations": [
            {"configuration": "dense", "seeds": 3, "training_flops_saved_pct": 0.0, "val_loss_mean": 4.0,
             "val_loss_std": 0.01},
            {"configuration": label, "seeds": 2, "training_flops_saved_pct": 10.0, "mean_dropout_predicted": 0.1,
             "total_flops_saved_pct": 9.0, "vs_dense": _comparison(label, "dense", diff=0.02, pct=pct, verdict="worse",
                                                                   holm="within noise", p_holm=0.2)},
            # a variant other than the schedule, r_train and the early-exit loss: left to the findings page
            {"configuration": "ILD+DTS p_max=0.4, per-batch", "seeds": 2, "training_flops_saved_pct": 10.0,
             "mean_dropout_predicted": 0.1, "vs_dense": _comparison("ILD+DTS p_max=0.4, per-batch", "dense", pct=-1)},
            # the constant schedule at twice the P̄: listed, after every configuration of a smaller P̄
            {"configuration": "ILD p_max=0.4", "seeds": 2, "training_flops_saved_pct": 20.0,
             "mean_dropout_predicted": 0.2, "vs_dense": _comparison("ILD p_max=0.4", "dense", pct=1.0)},
            # the increasing schedule at the same P̄: after ILD+DTS
            {"configuration": "ILD+ITS p_max=0.4", "seeds": 1, "training_flops_saved_pct": 10.0,
             "mean_dropout_predicted": 0.1, "vs_dense": _comparison("ILD+ITS p_max=0.4", "dense", pct=0.2)},
        ],
        "findings": [
            {"id": "cost-at-equal-steps", "comparisons": [_comparison(label, "dense", pct=pct, paper_pct=0.82)]},
            {"id": "pareto", "comparisons": [  # an observation: never among the page's tests, its verdict raw
                _comparison("ILD p_max=0.4", "dense, 822 steps (compute-matched)", pct=-2.0, se=0.01, observation=True),
                _comparison(label, "dense, 911 steps (compute-matched)", diff=-0.02, pct=-0.5, se=0.01,
                            verdict="better", p_holm=0.01)]},
            {"id": "early-exit", "comparisons": [
                {**_comparison(f"{label}, exit 5", "dense", diff=-0.3), "metric": "exit_5"},
                {**_comparison(f"{label}, exit 6", "dense", diff=exit_gain, se=0.03, verdict="better"),
                 "metric": "exit_6"}]},
        ],
    }


def test_a_report_gives_dense_and_each_ild_dts_p_max_with_the_findings_numbers():
    dense, ild_dts, ild, ild_its = rows(_report(6.2, 0.5, -0.1))
    assert (ild["schedule"], ild["p_bar"], ild["matched_to"]) == ("ILD", 0.2, "dense, 822 steps (compute-matched)")
    assert (ild_its["schedule"], ild_its["equal_steps"]["pct"], ild_its["exit_gain"]) == ("ILD+ITS", 0.2, None)
    assert (dense["configuration"], dense["val_loss"], dense["seeds"]) == ("dense", 4.0, 3)
    assert ild_dts["configuration"] == "ILD+DTS p_max=0.4" and ild_dts["p_max"] == 0.4
    # %Δ ± SE in % of dense's loss (0.02 of 4.0 = 0.5%), the verdict after Holm
    assert ild_dts["equal_steps"] == {"pct": 0.5, "pct_se": pytest.approx(0.5), "verdict": "within noise"}
    assert ild_dts["paper_pct"] == 0.82
    # the compute-matched comparison of this configuration, not another's
    assert ild_dts["equal_flops"] == {"pct": -0.5, "pct_se": pytest.approx(0.25), "verdict": "better"}
    assert ild_dts["matched_to"] == "dense, 911 steps (compute-matched)"
    assert ild["equal_flops"]["verdict"] == "within noise, raw"  # an observation: no "after Holm" for it
    assert (ild_dts["flops_saved_pct"], ild_dts["total_flops_saved_pct"]) == (10.0, 9.0)
    # the middle exit of 12 layers is exit 6
    assert ild_dts["middle_exit"] == 6
    assert ild_dts["exit_gain"] == {"diff": -0.1, "se": 0.03, "verdict": "better", "against": "dense"}


def test_r_train_one_and_the_early_exit_loss_are_listed_beside_their_schedule():
    report = _report(6.2, 0.5, -0.1)
    eel = "ILD+DTS p_max=0.4 + early-exit loss 0.5 (rotational 3, uniform)"
    report["configurations"] += [
        {"configuration": "ILD+DTS p_max=0.8, r_train=1", "seeds": 2, "training_flops_saved_pct": 20.0,
         "mean_dropout_predicted": 0.2, "vs_dense": _comparison("ILD+DTS p_max=0.8, r_train=1", "dense", pct=-0.1)},
        {"configuration": eel, "seeds": 2, "training_flops_saved_pct": 10.0, "total_flops_saved_pct": -31.0,
         "mean_dropout_predicted": 0.1, "vs_dense": _comparison(eel, "dense", pct=0.1)}]
    report["findings"].append({"id": "early-exit-loss", "comparisons": [  # against its twin without the loss
        {**_comparison(f"{eel}: exit 6 loss", "ILD+DTS p_max=0.4", diff=-0.12, verdict="better"), "metric": "exit_6"}]})
    table = choosing([report])
    assert [(r["configuration"], r.get("variant")) for r in table] == [
        ("dense", None), ("ILD+DTS p_max=0.4", ""), (eel, "early-exit loss"), ("ILD+ITS p_max=0.4", ""),
        ("ILD+DTS p_max=0.8, r_train=1", "r_train=1"), ("ILD p_max=0.4", "")]
    lines = markdown_table(table)
    assert lines[4] == (f"| {eel} | 10% | 6.2 TPP | 2 | 10.0% / -31.0% | +0.10% ± 0.50 (within noise) | – | "
                        "no compute-matched baseline | -0.120 ± 0.020 nats at exit 6 vs ILD+DTS p_max=0.4 (better) |")


def test_budgets_sit_side_by_side_per_configuration_and_render_as_the_readme_table():
    table = choosing([_report(6.2, 0.3, -0.25), _report(2.1, 0.5, -0.1)])
    assert [(r["configuration"], r["tokens_per_parameter"]) for r in table] == [
        ("dense", 2.1), ("dense", 6.2), ("ILD+DTS p_max=0.4", 2.1), ("ILD+DTS p_max=0.4", 6.2),
        ("ILD+ITS p_max=0.4", 2.1), ("ILD+ITS p_max=0.4", 6.2), ("ILD p_max=0.4", 2.1), ("ILD p_max=0.4", 6.2)]
    lines = markdown_table(table)
    assert lines[0].startswith("| configuration | P̄ | budget | seeds | FLOPs saved (non-embedding / total) |")
    assert lines[2] == "| dense | 0% | 2.1 TPP | 3 | 0.0% | loss 4.000 ± 0.010 | – | – | – |"
    assert lines[5] == ("| ILD+DTS p_max=0.4 | 10% | 6.2 TPP | 2 | 10.0% / 9.0% | +0.30% ± 0.50 (within noise) | "
                        "+0.82% | -0.50% ± 0.25 (better) | -0.250 ± 0.030 nats at exit 6 (better) |")
    assert lines[9] == ("| ILD p_max=0.4 | 20% | 6.2 TPP | 2 | 20.0% | +1.00% ± 0.50 (within noise) | – | "
                        "-2.00% ± 0.25 (within noise, raw) | – |")


def test_a_configuration_without_a_compute_matched_baseline_says_so():
    report = _report(6.2, 0.5, -0.1)
    report["findings"][1]["comparisons"].pop()
    [_, ild_dts, _, _] = rows(report)
    assert ild_dts["equal_flops"] is None
    assert "no compute-matched baseline" in markdown_table([ild_dts])[2]


def test_the_readme_table_is_the_committed_reports_table():
    """The "Choosing a configuration" table (docs/guide/reproducing.md) is a copy of the newest report's
    (which carries the other budgets through --across): re-reporting without updating the guide fails here."""
    report = json.loads((ROOT / "docs" / "reproduction-20tpp" / "report.json").read_text())
    expected = markdown_table(report["choosing"])
    readme = GUIDE.read_text().splitlines()
    section = readme[readme.index("### Choosing a configuration"):]
    start = section.index(expected[0])
    assert section[start:start + len(expected)] == expected
    # and the report's table is what its report.json documents give today
    across = [json.loads((ROOT / "docs" / page / "report.json").read_text())
              for page in ("reproduction-6tpp", "reproduction")]
    assert markdown_table(choosing([report, *across])) == expected


# A number in prose: signed or not, with thousands commas, decimals or a percent sign (plain integers,
# counts of seeds, steps and exits, are left out); "−" is the minus sign the README writes.
NUMBER = re.compile(r"(?<![\w.])[+−-]?\d+(?:\.\d+)?%?(?![\w.%])")
LINK = re.compile(r"\]\(\.\./([^)#]+\.md)\)")  # the guide's links to the report pages, from docs/guide/
GUIDE = ROOT / "docs" / "guide" / "reproducing.md"


def _numbers(text: str) -> list[tuple[str, float, int]]:
    """(as written, |value|, decimals) of each number in ``text`` that has decimals or a percent sign."""
    found = []
    for match in NUMBER.finditer(text):
        word = match.group(0)
        digits = word.lstrip("+−-").rstrip("%")
        if "." in digits or word.endswith("%"):
            found.append((word, float(digits), len(digits.partition(".")[2])))
    return found


def _backed(value: float, decimals: int, page_values: list[float]) -> bool:
    """Some number of the pages rounds to ``value`` at its decimals (the sentence may round; never invent)."""
    return any(abs(v - value) <= 0.5 * 10 ** -decimals + 1e-9 for v in page_values)


def test_every_number_the_advice_sentences_name_is_in_the_report_pages_they_cite():
    """The "Choosing a configuration" prose (the table has its own test above): each number a
    sentence names must be one the committed reports print (docs/reproduction, docs/reproduction-6tpp,
    docs/reproduction-20tpp) or one of the pages the section links, so re-reporting without rewriting the
    advice fails here."""
    readme = GUIDE.read_text()
    section = readme[readme.index("### Choosing a configuration"):]
    prose = "\n".join(line for line in section.splitlines() if not line.startswith("|"))
    pages = {"docs/reproduction/README.md", "docs/reproduction-6tpp/README.md", "docs/reproduction-20tpp/README.md",
             *(f"docs/{page}" for page in LINK.findall(prose))}
    page_values = [value for page in sorted(pages) for _, value, _ in _numbers((ROOT / page).read_text())]
    sentences = _numbers(prose)
    assert len(sentences) > 30  # the advice names its numbers
    unbacked = [word for word, value, decimals in sentences if not _backed(value, decimals, page_values)]
    assert unbacked == [], f"the guide's advice names numbers no report page has: {unbacked}"


def test_the_sentence_check_catches_a_number_no_page_has():
    page_values = [v for _, v, _ in _numbers("ILD+ITS p_max=0.8: -1.13% ± 0.42, exit 6 −0.1204 nats, 4.2466")]
    assert _backed(1.13, 2, page_values) and _backed(0.120, 3, page_values) and _backed(0.12, 2, page_values)
    assert not _backed(1.31, 2, page_values) and not _backed(4.2465, 4, page_values)  # a slip, and a mis-rounding
    assert [w for w, _, _ in _numbers("P̄ 20%, 3 seeds, 10,000 steps, +0.34% and 4.2541 / 4.2466")] == [
        "20%", "+0.34%", "4.2541", "4.2466"]
