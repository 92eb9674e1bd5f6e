"""layerdrop report: labels, statistics and verdicts recomputed from hand-made run folders."""

import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

from eval.experiments.report.build import main
from eval.experiments.report.tables import ranks, spearman
from eval.experiments.report.significance import pooled_std
from eval.experiments.sweep.results import dropout_label, label_configurations, load_results
from eval.experiments.report.findings.verdicts import verdict
from tests.eval.experiments.run_folders import skip_rows, slices, write_run

@pytest.fixture()
def sweep(tmp_path) -> Path:
    root = tmp_path / "sweep"
    for seed, mean in enumerate((3.00, 3.02, 3.01)):
        write_run(root, f"dense,seed={seed}", seed, slices(mean), skip=skip_rows(mean, mean + 2.0), speedup=0.9)
    for seed, mean in enumerate((2.90, 2.93)):  # clearly better than dense
        write_run(root, f"good,seed={seed}", seed, slices(mean), p_max=0.4, skip=skip_rows(mean, mean + 1.0),
                  speedup=1.2 + seed * 0.01)
    for seed, mean in enumerate((3.02, 3.03)):  # ILD+DTS at P̄ 5%, where the paper claims parity
        write_run(root, f"p05,seed={seed}", seed, slices(mean), p_max=0.2)
    write_run(root, "sub,seed=0", 0, slices(3.30), p_max=0.4, structure="sublayer")  # clearly worse
    write_run(root, "alt,seed=0", 0, slices(3.005), p_max=0.4, distribution="alternating", schedule="constant",
              skip=skip_rows(3.005, 3.1))
    write_run(root, "ild,seed=0", 0, slices(3.01), p_max=0.4, schedule="constant", skip=skip_rows(3.01, 3.9))
    write_run(root, "uni,seed=0", 0, slices(3.2), p_max=0.2, distribution="uniform", schedule="constant")
    (root / "runs" / "unfinished,seed=0").mkdir()
    return root


def test_configurations_are_labelled_in_the_papers_words():
    assert dropout_label({"p_max": 0.0}) == "dense"
    assert dropout_label({"p_max": 0.4, "distribution": "increasing", "schedule": "decreasing"}) == "ILD+DTS p_max=0.4"
    assert dropout_label({"p_max": 0.2, "distribution": "uniform", "schedule": "constant"}) == "uniform p_max=0.2"
    assert dropout_label({"p_max": 0.8, "distribution": "increasing", "schedule": "increasing", "mask": "batch",
                          "structure": "sublayer", "r_train": "one"}) == \
        "ILD+ITS p_max=0.8, sublayer, per-batch, r_train=1"
    assert dropout_label({"p_max": 0.4, "distribution": "alternating", "schedule": "constant"}) == "ALD p_max=0.4"


def test_settings_that_vary_outside_layer_dropout_join_the_label(sweep):
    results, skipped = load_results(sweep)
    assert skipped == ["unfinished,seed=0: not started"]
    by_name = {r.name: r for r in results}
    by_name["dense,seed=0"].config["model"]["decoder"]["d_model"] = 64
    label_configurations(results)
    assert by_name["dense,seed=0"].label == "dense, d_model=64"
    assert by_name["dense,seed=1"].label == "dense, d_model=32"
    assert by_name["alt,seed=0"].label == "ALD p_max=0.4, d_model=32"


def test_a_setting_older_runs_lack_does_not_join_their_labels(sweep):
    """Runs adopted from an older report lack settings the schema gained since: the label lists
    what the runs that have a setting disagree on, not "family=None" for every older run."""
    results, _ = load_results(sweep)
    by_name = {r.name: r for r in results}
    for name in ("dense,seed=0", "alt,seed=0"):
        by_name[name].config["model"]["decoder"]["family"] = "celerity"
    label_configurations(results)
    assert by_name["dense,seed=0"].label == "dense" and by_name["dense,seed=1"].label == "dense"
    by_name["alt,seed=0"].config["model"]["decoder"]["family"] = "llama"
    label_configurations(results)
    assert by_name["dense,seed=0"].label == "dense, family=celerity"
    assert by_name["alt,seed=0"].label == "ALD p_max=0.4, family=llama"
    assert by_name["dense,seed=1"].label == "dense"


def test_a_run_trained_but_not_yet_evaluated_is_left_out_not_compared_by_its_training_val_loss(sweep):
    """A sweep that asks for a held-out evaluation compares held-out losses only: a run whose
    evaluation is still pending (summary.json written, evals/heldout.json not yet) would
    otherwise enter with its end-of-training val loss, a different measure."""
    (sweep / "sweep.yaml").write_text(yaml.safe_dump({"evals": [
        {"name": "heldout", "command": "eval heldout"},
        {"name": "skip", "command": "eval skip", "only": ["dense,*", "alt,*"]}]}))
    (sweep / "runs" / "good,seed=1" / "evals" / "heldout.json").unlink()   # asked of every run
    (sweep / "runs" / "alt,seed=0" / "evals" / "skip.json").unlink()        # asked of dense and alt only
    (sweep / "runs" / "good,seed=0" / "evals" / "skip.json").unlink()       # not asked of good: still in
    results, skipped = load_results(sweep)
    names = {r.name for r in results}
    assert "good,seed=1" not in names and "alt,seed=0" not in names and "good,seed=0" in names
    assert "good,seed=1: trained, evaluations pending: heldout" in skipped
    assert "alt,seed=0: trained, evaluations pending: skip" in skipped
    (sweep / "sweep.yaml").unlink()  # a folder of runs alone: nothing is asked, every trained run is in
    assert {r.name for r in load_results(sweep)[0]} == names | {"good,seed=1", "alt,seed=0"}


def test_verdicts_by_hand():
    assert pooled_std([[1.0, 3.0], [2.0, 2.0, 5.0]])[0] == pytest.approx(math.sqrt((2 + 6) / 3))
    make = lambda v, **k: {"verdict": v, **k}  # noqa: E731
    assert verdict([make("better"), make("better")]) == "reproduced"
    assert verdict([make("better"), make("within noise")]) == "within noise"
    assert verdict([make("better"), make("worse")]) == "not reproduced"
    assert verdict([make("worse")], expected="worse") == "reproduced"
    assert verdict([]) == "not tested"
    # against the paper beyond the noise, but not beyond the paper's own figure for it
    consistent = make("worse", vs_paper="within noise of or below the paper's figure")
    assert verdict([make("better"), consistent]) == "consistent with the paper's own figure"
    assert verdict([consistent, make("worse", vs_paper="beyond the paper's figure")]) == "not reproduced"
    # an observation is shown, never counted
    assert verdict([make("worse", observation=True)]) == "not tested"
    assert verdict([make("better"), make("worse", observation=True)]) == "reproduced"


def test_spearman_matches_scipy_and_handles_ties():
    assert ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    x, y = [0.0, 0.1, 0.1, 0.2, 0.4, 0.3], [5.0, 4.0, 4.5, 2.0, 1.0, 1.5]
    scipy_stats = pytest.importorskip("scipy.stats")
    assert spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_report_numbers_and_verdicts_from_the_run_folders(sweep, tmp_path):
    out = tmp_path / "report"
    assert main([str(sweep), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    rows = {r["configuration"]: r for r in report["configurations"]}
    dense_losses = [3.00, 3.02, 3.01]
    assert rows["dense"]["val_loss_mean"] == pytest.approx(statistics.fmean(dense_losses))
    assert rows["dense"]["val_loss_std"] == pytest.approx(statistics.stdev(dense_losses))
    # unpaired noise: the pooled std over seeds of dense (2 dof), good and p05 (1 each)
    sigma = math.sqrt((2 * statistics.variance(dense_losses) + statistics.variance([2.90, 2.93])
                       + statistics.variance([3.02, 3.03])) / 4)
    assert report["noise"]["seed_std"] == pytest.approx(sigma) and report["noise"]["seed_dof"] == 4
    # paired noise: loss = configuration + seed; the one-seed configurations and dense's seed 2 fit
    # exactly, so the residual is that of the 3 × 2 block (dense, good, p05 at seeds 0, 1): with two
    # seeds, σ² = variance of the seed-1 − seed-0 steps over the configurations / 2, dof 3 − 1
    steps = [3.02 - 3.00, 2.93 - 2.90, 3.03 - 3.02]
    residual = math.sqrt(statistics.variance(steps) / 2)
    assert report["noise"]["residual_std"] == pytest.approx(residual) and report["noise"]["residual_dof"] == 2
    good = rows["ILD+DTS p_max=0.4"]
    assert good["mean_dropout_achieved"] == pytest.approx(0.1) and good["training_flops_saved_pct"] == pytest.approx(10)
    # the paired evaluation noise: slices of (good, seed 0) minus slices of (dense, seed 0)
    diffs = [a - b for a, b in zip(slices(2.90), slices(3.00))]
    assert good["vs_dense"]["eval_se"] == pytest.approx(statistics.stdev(diffs) / 2, abs=1e-12)
    # paired over seeds 0 and 1: the mean of (2.90 − 3.00, 2.93 − 3.02), SE σ·√(2/2); t on 2 dof,
    # whose two-sided p is 1 − t/√(t² + 2)
    vs = good["vs_dense"]
    assert vs["paired"] == 2 and vs["diff"] == pytest.approx(-0.095) and vs["se"] == pytest.approx(residual)
    t = 0.095 / residual
    assert vs["dof"] == 2 and vs["p_value"] == pytest.approx(1 - t / math.sqrt(t * t + 2))
    assert vs["verdict"] == "better" and vs["pct"] == pytest.approx(100 * -0.095 / 3.01)
    findings = {f["id"]: f for f in report["findings"]}
    # parity is judged at P̄ 5% only: p05 is +0.015 (t = 0.015/σ ≈ 2.1 on 2 dof: within noise)
    [headline] = findings["headline"]["comparisons"]
    assert headline["a"] == "ILD+DTS p_max=0.2" and headline["diff"] == pytest.approx(0.015)
    assert headline["verdict"] == "within noise" and findings["headline"]["verdict"] == "within noise"
    assert headline["paper_pct"] == pytest.approx(0.46)  # Table 3, 271M (the size nearest a hand-made model)
    # P̄ 10%: −3.2% is below the paper's own +0.82%: consistent with it
    cost = findings["cost-at-equal-steps"]
    assert cost["verdict"] == "consistent with the paper's own figure" and cost["comparisons"][0]["observation"]
    assert findings["finding-1"]["verdict"] == "reproduced"  # sublayer clearly worse than layer
    assert findings["finding-2"]["verdict"] == "not tested"
    assert findings["finding-3"]["verdict"] == "reproduced"  # ILD and ALD (P̄ 0.2) beat uniform 0.2
    assert len(findings["finding-3"]["comparisons"]) == 2
    assert findings["skip-ald"]["verdict"] == "reproduced"  # ALD skips alternate layers best
    assert findings["pareto"]["verdict"] == "no compute-matched baseline"
    # speedups paired over seeds 0, 1: (1.20 − 0.9, 1.21 − 0.9)
    assert findings["speculative"]["comparisons"][0]["diff"] == pytest.approx(0.305)
    assert findings["speculative"]["comparisons"][0]["pct"] == pytest.approx(100 * 0.305 / 0.9)
    assert report["speculative"][0]["configuration"] == "dense"
    points = {p["run"]: p for p in report["elasticity"]["points"]}
    assert points["good,seed=0"]["skip_degradation"] == pytest.approx(((2.90 + 1.0) + (2.90 + 0.3)) / 2 - 2.90)
    assert points["good,seed=0"]["exit_degradation"] == pytest.approx(statistics.fmean([1.5, 1.0, 0.5]))
    text = (out / "README.md").read_text()
    assert "ILD+DTS p_max=0.4" in text and "**reproduced**" in text and "unfinished,seed=0" in text
    assert f"This page makes **{report['multiple_comparisons']['tests']} tests**" in text
    for image in report["images"].values():
        assert (out / image).stat().st_size > 1000
    # rebuilt from the copy alone
    again = tmp_path / "again"
    assert main([str(out), "--out", str(again)]) == 0
    assert json.loads((again / "report.json").read_text())["configurations"] == report["configurations"]


def test_the_early_exit_loss_is_judged_against_its_twin_without_it_and_nowhere_else(sweep, tmp_path):
    """Runs trained with the early-exit loss: their exits and exit drafts against the same
    layer dropout without it (what it buys), their last layer too (what it costs); the
    paper's layer-dropout findings ignore them."""
    eel = {"scale": 0.5, "exits": "all", "weighting": "uniform", "curriculum": "rotational", "rotation": 3}
    for seed, mean in enumerate((2.95, 2.97)):  # the last layer: 0.045 worse than "good" (2.90, 2.93)
        exits = {"1": mean + 0.4, "2": mean + 0.2, "3": mean + 0.1, "4": mean}  # "good"'s: + 1.5, 1.0, 0.5
        write_run(sweep, f"good-eel,seed={seed}", seed, slices(mean), p_max=0.4, early_exit_loss=eel,
                  exits=exits, exit_drafts={2: 1.5 + 0.01 * seed})
    for seed, mean in enumerate((2.90, 2.92)):
        (sweep / "runs" / f"good,seed={seed}" / "evals" / "exit-draft-2.json").write_text(json.dumps({
            "draft": "exit", "exit_layer": 2, "skip_layers": [], "speedup": 0.8 + 0.01 * seed,
            "acceptance_rate": 0.2, "identical_to_greedy": True}))
    out = tmp_path / "report"
    assert main([str(sweep), "--out", str(out)]) == 0
    findings = {f["id"]: f for f in json.loads((out / "report.json").read_text())["findings"]}
    buys, costs = findings["early-exit-loss"], findings["early-exit-loss-cost"]
    label = "ILD+DTS p_max=0.4 + early-exit loss 0.5 (rotational 3, uniform)"
    by_what = {c["a"].removeprefix(label + ": "): c for c in buys["comparisons"]}
    assert set(by_what) == {"exit 1 loss", "exit 2 loss", "exit 3 loss", "exit-2 draft speedup"}
    assert {c["b"] for c in buys["comparisons"]} == {"ILD+DTS p_max=0.4"}
    assert by_what["exit 1 loss"]["diff"] == pytest.approx((2.96 + 0.4) - (2.915 + 1.5))  # paired over seeds 0, 1
    assert by_what["exit-2 draft speedup"]["diff"] == pytest.approx(1.505 - 0.805)
    assert by_what["exit-2 draft speedup"]["pct"] == pytest.approx(100 * (1.505 - 0.805) / 0.805)
    assert buys["verdict"] == "reproduced"
    [cost] = costs["comparisons"]
    assert cost["diff"] == pytest.approx(0.045) and costs["verdict"] == "not reproduced"  # a cost beyond noise
    # the paper's findings are about layer dropout alone: the run with exits trained is in none
    for identifier in ("headline", "cost-at-equal-steps", "early-exit", "speculative", "pareto"):
        assert not any("early-exit loss" in c["a"] for c in findings[identifier]["comparisons"]), identifier
    assert "is the small cost the claim allows" in (out / "README.md").read_text()


def test_a_folder_without_runs_is_a_one_line_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "not a sweep folder" in capsys.readouterr().err


def test_path_aliases_leave_no_machine_path_in_what_the_report_writes(sweep, tmp_path):
    out = tmp_path / "report"
    assert main([str(sweep), "--out", str(out), "--path-alias", f"{sweep}=sweeps/x"]) == 0
    written = [p for p in out.rglob("*") if p.is_file() and p.suffix in (".md", ".json", ".yaml")]
    assert len(written) > 10
    assert not [p for p in written if str(sweep) in p.read_text()]
    assert "sweeps/x/runs/dense,seed=0" in (out / "runs" / "dense,seed=0" / "config.yaml").read_text()
    assert "layerdrop report sweeps/x --out" in (out / "README.md").read_text()
    with pytest.raises(SystemExit):
        main([str(sweep), "--out", str(out), "--path-alias", "nothing"])


def test_fixed_drafts_and_the_early_exit_loss_in_the_labels(tmp_path):
    """`speculate run` reports (exit and skip drafts) become one row per configuration and
    draft; a run with the early-exit loss is labelled with it. A searched draft decoded with
    `--draft-from` is labelled per seed, and its greedy speedup is the run's Table 4 value."""
    from eval.experiments.report.build import build_report
    from eval.experiments.report.findings.inference import _exit_draft_speedup, speculative_speedup

    root = tmp_path / "sweep"
    for name, seed, extra in (("ild", 0, {}), ("ild", 1, {}), ("eel", 0, {"scale": 0.5, "curriculum": "rotational",
                                                                          "rotation": 3})):
        write_run(root, f"{name},seed={seed}", seed, slices(3.0), p_max=0.4)
        config_path = root / "runs" / f"{name},seed={seed}" / "config.yaml"
        config = yaml.safe_load(config_path.read_text())
        if extra:
            config["model"]["early_exit_loss"] = extra
        config_path.write_text(yaml.safe_dump(config))
        evals = root / "runs" / f"{name},seed={seed}" / "evals"
        for eval_name, exit_layer, skip in (("exit-draft-2", 2, []), ("skip-draft-odd", None, [1, 3])):
            (evals / f"{eval_name}.json").write_text(json.dumps({
                "speedup": 1.1 + seed + (exit_layer or 0) / 10, "acceptance_rate": 0.5, "draft_time_ratio": 0.4,
                "identical_to_greedy": True, "skip_layers": skip, "exit_layer": exit_layer}))
        for eval_name, mode in (("greedy-best", "greedy"), ("sampled-best", "sample")):
            (evals / f"{eval_name}.json").write_text(json.dumps({
                "speedup": 5.0 + seed + (mode == "sample"), "acceptance_rate": 0.6, "draft_time_ratio": 0.3,
                "identical_to_greedy": True if mode == "greedy" else None, "mode": mode, "temperature": 0.8,
                "skip_layers": [1, 3] if seed else [], "exit_layer": None if seed else 2, "draft_from": "s.json"}))
    report, results = build_report(root)
    assert [speculative_speedup(r) for r in results] == [5.0, 5.0, 6.0]
    assert [_exit_draft_speedup(2)(r) for r in results] == pytest.approx([1.3, 1.3, 2.3])  # the fixed draft only
    searched = {(r["configuration"], r["evaluation"]): r for r in report["drafts"] if r["evaluation"].endswith("best")}
    assert searched[("ILD+DTS p_max=0.4", "greedy-best")]["draft"] == "exit 2 / skip 1,3"
    assert searched[("ILD+DTS p_max=0.4", "sampled-best")]["mode"] == "sample"
    assert searched[("ILD+DTS p_max=0.4", "sampled-best")]["identical_to_greedy"] is None
    drafts = {(r["configuration"], r["draft"]): r for r in report["drafts"] if not r["evaluation"].endswith("best")}
    eel_label = "ILD+DTS p_max=0.4 + early-exit loss 0.5 (rotational 3, uniform)"
    assert set(drafts) == {(label, draft) for label in ("ILD+DTS p_max=0.4", eel_label)
                           for draft in ("exit 2", "skip 1,3")}
    assert drafts[("ILD+DTS p_max=0.4", "exit 2")]["speedup_per_seed"] == pytest.approx([1.3, 2.3])
    assert drafts[("ILD+DTS p_max=0.4", "exit 2")]["speedup_mean"] == pytest.approx(1.8)
    assert drafts[(eel_label, "skip 1,3")]["seeds"] == 1
    assert main([str(root), "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "README.md").read_text()
    assert "## Drafts decoded with `speculate run`" in page and "| sample T=0.8 |" in page


def _downstream(folder: Path, piqa: float, arc: float) -> None:
    (folder / "evals" / "downstream.json").write_text(json.dumps({
        "tasks": ["piqa", "arc_easy"], "lm_eval_version": "0.4",
        "summary": {"piqa": {"metric": "acc_norm,none", "value": piqa}, "arc_easy": {"metric": "acc,none", "value": arc}},
        "results": {"piqa": {"acc_norm,none": piqa, "acc_norm_stderr,none": 0.02},
                    "arc_easy": {"acc,none": arc, "acc_stderr,none": 0.03}},
        "data": {"piqa": {"scored": 200}, "arc_easy": {"scored": 150}}}))


def test_downstream_reports_make_the_table_a3_block_read_against_chance(tmp_path):
    root = tmp_path / "sweep"
    for seed, (piqa, arc) in enumerate(((0.52, 0.26), (0.54, 0.30))):
        write_run(root, f"dense,seed={seed}", seed, slices(3.0 + seed / 100))
        _downstream(root / "runs" / f"dense,seed={seed}", piqa, arc)
    write_run(root, "good,seed=0", 0, slices(2.9), p_max=0.4)
    _downstream(root / "runs" / "good,seed=0", 0.55, 0.28)
    write_run(root, "none,seed=0", 0, slices(2.95), p_max=0.2)  # no downstream evaluation: no row
    out = tmp_path / "report"
    assert main([str(root), "--out", str(out)]) == 0
    section = json.loads((out / "report.json").read_text())["downstream"]
    assert section["tasks"]["piqa"] == {"metric": "acc_norm,none", "chance": 0.5}
    rows = {r["configuration"]: r["tasks"] for r in section["rows"]}
    assert set(rows) == {"dense", "ILD+DTS p_max=0.4"}
    assert rows["dense"]["piqa"]["mean"] == pytest.approx(0.53)
    assert rows["dense"]["piqa"]["std"] == pytest.approx(statistics.stdev([0.52, 0.54]))
    assert rows["dense"]["arc_easy"]["stderr"] == pytest.approx(0.03) and rows["dense"]["arc_easy"]["documents"] == 150
    assert rows["ILD+DTS p_max=0.4"]["piqa"]["std"] is None and rows["ILD+DTS p_max=0.4"]["piqa"]["seeds"] == 1
    text = (out / "README.md").read_text()
    assert "## Downstream benchmarks (Table A.3 form)" in text and "| chance | 0.500 | 0.250 |" in text
    assert "| dense | 0.530 ± 0.014 (2) | 0.280 ± 0.028 (2) |" in text


def test_a_configuration_whose_seeds_are_all_worse_and_disagree_is_reported_worse(tmp_path):
    """docs/RULES.md: a configuration whose spread is beyond the others' stays in the pooled noise (flagged,
    never left out), is judged there, and is never "within noise" or "consistent" when every seed lies beyond
    by more than 2 pooled σ; the other analysis (it out of the pool, on its own spread) is shown beside."""
    root = tmp_path / "sweep"
    for seed, (dense, steady, erratic) in enumerate(((3.00, 3.02, 3.35), (3.01, 3.025, 3.65))):
        write_run(root, f"dense,seed={seed}", seed, slices(dense))
        write_run(root, f"ild-dts-0.4,seed={seed}", seed, slices(steady), p_max=0.4)
        write_run(root, f"ild-dts-0.8,seed={seed}", seed, slices(erratic), p_max=0.8)
    out = tmp_path / "report"
    assert main([str(root), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    noise = report["noise"]
    [flagged] = noise["flagged"]
    assert flagged["configuration"] == "ILD+DTS p_max=0.8" and flagged["per_seed"] == pytest.approx([3.35, 3.65])
    # kept in the pool: dense, 0.4 and 0.8 at two seeds each, one dof apiece
    every = [[3.00, 3.01], [3.02, 3.025], [3.35, 3.65]]
    assert noise["seed_std"] == pytest.approx(pooled_std(every)[0]) and noise["seed_dof"] == 3
    assert noise["without_flagged"]["seed_std"] == pytest.approx(pooled_std(every[:2])[0])
    rows = {r["configuration"]: r for r in report["configurations"]}
    vs = rows["ILD+DTS p_max=0.8"]["vs_dense"]
    assert vs["paired"] == 2 and vs["diff"] == pytest.approx(0.495)
    assert vs["seed_gaps"] == {"0": pytest.approx(0.35), "1": pytest.approx(0.64)}
    # the t test on 2 dof stops just short of α; every seed beyond 2 pooled σ decides: worse, before and after Holm
    assert vs["p_value"] > 0.05 and 0.35 > 2 * noise["seed_std"] and vs["seeds_beyond"] == "worse"
    assert vs["verdict"] == "worse" and vs["verdict_holm"] == "worse"
    # judged on its own spread, as before docs/RULES.md, two seeds this far apart could not be called worse
    assert vs["alternative"]["verdict"] == "within noise" and vs["alternative"]["paired"] == 0
    cost = {f["id"]: f for f in report["findings"]}["cost-at-equal-steps"]
    by_a = {c["a"]: c for c in cost["comparisons"]}
    assert by_a["ILD+DTS p_max=0.8"]["vs_paper"] == "beyond the paper's figure"  # +16% against the paper's +2.93%
    assert cost["verdict"] == "not reproduced"
    text = (out / "README.md").read_text()
    assert "**Spread beyond the others (flagged)**: ILD+DTS p_max=0.8" in text and "3.3500 / 3.6500" in text
    assert "[other analysis, flagged spread out of the pool:" in text and "→ within noise]" in text


def _record(folder: Path, train_tokens: int) -> None:
    summary = json.loads((folder / "summary.json").read_text())
    summary["data"] = {"identity": {"data": {"tokenizer_sha256": "f" * 64, "splits": {
        "train": {"documents": 40, "tokens": train_tokens}, "val": {"documents": 2, "tokens": 300}}}}}
    (folder / "summary.json").write_text(json.dumps(summary))


def test_the_page_says_which_data_the_runs_read_and_flags_two(sweep, tmp_path):
    """Runs that predate the record say nothing (every committed page stays as it was); one
    record is one line; two records name each one's runs, as comparisons across them mix corpora."""
    assert main([str(sweep), "--out", str(tmp_path / "none")]) == 0
    assert "Data:" not in (tmp_path / "none" / "README.md").read_text()

    runs = sorted(p for p in (sweep / "runs").iterdir() if (p / "summary.json").is_file())
    for folder in runs[1:]:
        _record(folder, 9000)
    assert main([str(sweep), "--out", str(tmp_path / "one")]) == 0
    text = (tmp_path / "one" / "README.md").read_text()
    assert f"Data: every run that records it read the same (1 run predates the record): data: tokenizer sha256 " \
           f"ffffffffffff…, train 9,000 tokens / 40 documents, val 300 tokens / 2 documents." in text
    report = json.loads((tmp_path / "one" / "report.json").read_text())
    assert report["data"]["unrecorded"] == [runs[0].name] and len(report["data"]["identities"]) == 1

    _record(runs[0], 9001)
    assert main([str(sweep), "--out", str(tmp_path / "two")]) == 0
    text = (tmp_path / "two" / "README.md").read_text()
    assert "**Data: the runs read 2 different data**; comparisons across them mix corpora or tokenizers:" in text
    assert f"train 9,001 tokens / 40 documents, val 300 tokens / 2 documents: {runs[0].name}\n" in text


def test_how_it_was_run_counts_in_words_and_converts_cpu_time_on_the_sweeps_own_machine(sweep, tmp_path):
    """Once printed "1 runs", "1 thread(s)" and hours of "a 2-core machine" whatever the machine."""
    machine = {"host": {"cpu": "X", "cores": 16, "memory_gb": 64, "gpus": []}, "python": "3.11", "torch": "2",
               "jobs": 1, "threads_per_job": 1}
    (sweep / "machine.json").write_text(json.dumps(machine))
    assert main([str(sweep), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "README.md").read_text()
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    cpu = sum(run["cpu_seconds"] for run in report["runs"])
    assert "; 1 run at a time, 1 thread each." in text
    assert f"{len(report['runs'])} runs; {cpu / 3600:.2f} CPU-hours" in text
    assert f"(= {cpu / 3600 / 16:.2f} hours of its 16-core machine; wall time" in text
    (sweep / "machine.json").unlink()  # no record of the machine: no conversion
    assert main([str(sweep), "--out", str(tmp_path / "bare")]) == 0
    assert "CPU time (wall time depends on what else runs)." in (tmp_path / "bare" / "README.md").read_text()
