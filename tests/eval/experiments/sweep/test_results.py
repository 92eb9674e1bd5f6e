"""A run's training FLOPs in both conventions, from summary.json as pretrain writes it now and as older
runs (the committed docs/**/runs) wrote it: the blocks only, the total rebuilt from the recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from eval.experiments.report.build import main
from eval.experiments.sweep.results import flop_conventions, load_results
from framework.config import EarlyExitLossConfig, ModelConfig
from framework.flops import head_flops_per_token
from framework.early_exit_loss import mean_exit_heads
from tests.eval.experiments.run_folders import LAYERS, slices, write_run

EEL = {"scale": 0.5}  # exits 1..3, every step


def _runs(root: Path) -> dict:
    write_run(root, "dense,seed=0", 0, slices(3.0))
    write_run(root, "eel,seed=0", 0, slices(3.0), p_max=0.4, early_exit_loss=EEL)
    return {r.name: r for r in load_results(root)[0]}


def test_an_older_summary_holds_the_blocks_and_its_total_is_rebuilt_from_the_recipe(tmp_path):
    runs = _runs(tmp_path / "sweep")
    eel = runs["eel,seed=0"]
    found = flop_conventions(eel)
    # the hand-made summary.json, as older runs wrote it: training_flops (the blocks) and its dense twin only
    assert found["non_embedding_training_flops"] == eel.summary["training_flops"] == pytest.approx(0.9e12)
    assert found["dense_non_embedding_training_flops"] == pytest.approx(1e12)
    # the unembedding on every token trained (the summary's 1,000), once for the final layer and once per exit
    # head (3 a step)
    head = eel.summary["tokens"] * head_flops_per_token(ModelConfig(n_layers=LAYERS, d_model=32))
    heads = mean_exit_heads(EarlyExitLossConfig(**EEL), LAYERS, 100)
    assert heads == 3 and found["total_from"] == "recipe"
    assert found["total_training_flops"] == pytest.approx(0.9e12 + head * (1 + heads))
    assert found["dense_total_training_flops"] == pytest.approx(1e12 + head)
    # pretrain's summary today names both: they are read as they are
    named = {"non_embedding_training_flops": 1.0, "dense_non_embedding_training_flops": 2.0,
             "total_training_flops": 3.0, "dense_total_training_flops": 4.0}
    eel.summary.update(named)
    assert flop_conventions(eel) == {**named, "total_from": "summary"}
    # a recipe the sweep cannot predict: the total is missing, never guessed
    eel.summary = {k: v for k, v in eel.summary.items() if k not in named}
    eel.config["model"]["decoder"]["no_such_field"] = 1
    assert flop_conventions(eel)["total_training_flops"] is None and flop_conventions(eel)["total_from"] is None


def test_the_report_carries_both_conventions_and_the_early_exit_row_shows_its_cost(tmp_path):
    root = tmp_path / "sweep"
    _runs(root)
    out = tmp_path / "report"
    assert main([str(root), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    rows = {r["configuration"]: r for r in report["configurations"]}
    [eel] = [row for label, row in rows.items() if label.startswith("ILD+DTS p_max=0.4 + early-exit loss 0.5")]
    expected = flop_conventions(load_results(root)[0][1])
    for key in ("non_embedding_training_flops", "dense_non_embedding_training_flops", "total_training_flops",
                "dense_total_training_flops"):
        assert eel[key] == pytest.approx(expected[key])
    assert eel["non_embedding_flops_saved_pct"] == pytest.approx(10.0) == eel["training_flops_saved_pct"]
    total_saved = 100 * (1 - expected["total_training_flops"] / expected["dense_total_training_flops"])
    assert eel["total_flops_saved_pct"] == pytest.approx(total_saved)
    assert total_saved < eel["non_embedding_flops_saved_pct"]  # its three exit heads a step are not saved
    assert eel["total_flops_from"] == ["recipe"]
    text = (out / "README.md").read_text()
    assert "| non-embedding FLOPs | saved | total FLOPs | saved |" in text and f"| {total_saved:.1f}% |" in text
    run = next(r for r in report["runs"] if r["run"] == "eel,seed=0")
    assert run["total_training_flops"] == pytest.approx(expected["total_training_flops"])


def test_a_compute_matched_run_names_the_convention_it_matches_on(tmp_path):
    root = tmp_path / "sweep"
    for seed in (0, 1):
        write_run(root, f"dense,seed={seed}", seed, slices(3.0))
        write_run(root, f"ild-dts-0.4,seed={seed}", seed, slices(3.0), p_max=0.4)
        write_run(root, f"dense-steps=90,seed={seed}", seed, slices(3.05), steps=90)  # 90% of the blocks' FLOPs
    found = {r.name: r for r in load_results(root)[0]}
    assert found["dense-steps=90,seed=0"].matched_to == ["ild-dts-0.4,seed=0", "ild-dts-0.4,seed=1"]
    assert found["dense-steps=90,seed=0"].matched_on == ["non-embedding"]


def test_a_planned_run_without_a_folder_is_listed_not_started_unless_the_plan_cannot_be_read(tmp_path):
    """A sweep makes a run's folder when it starts it: the runs its sweep.yaml plans beyond them are
    named too, so a report of an unfinished sweep says what is missing, not only what is running."""
    root = tmp_path / "sweep"
    write_run(root, "dense,seed=0", 0, slices(3.0))
    write_run(root, "ild,seed=0", 0, slices(3.1), p_max=0.4)
    tiny = Path(__file__).resolve().parents[4] / "recipes" / "tiny.yaml"
    plan = {"base": str(tiny), "data": {"dir": str(tmp_path / "data")}, "seeds": [0, 1],
            "runs": {"dense": {"model.layer_dropout.p_max": 0.0}, "ild": {"model.layer_dropout.p_max": 0.4}}}
    (root / "sweep.yaml").write_text(yaml.safe_dump(plan))
    results, skipped = load_results(root)
    assert sorted(r.name for r in results) == ["dense,seed=0", "ild,seed=0"]
    assert skipped == ["dense,seed=1: not started", "ild,seed=1: not started"]
    # a report folder copied where its base recipe is not: its folders alone, no guess at the plan
    (root / "sweep.yaml").write_text(yaml.safe_dump({**plan, "base": str(tmp_path / "elsewhere.yaml")}))
    assert load_results(root)[1] == []
