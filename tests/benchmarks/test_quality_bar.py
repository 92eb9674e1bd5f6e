"""benchmarks/quality_bar.py and benchmarks/plain_training.py: the baselines' `framework` weight
decay is the framework's (the same tensors, η·λ = 1/(τ_EMA·steps)); seeds and confirm seeds make
rows that a rerun reuses; --jobs 2 gives the rows --jobs 1 gives; the table prints mean ± std and
marks an optimum at its grid's edge; bad arguments are one-line errors before any training."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks import quality_bar
from benchmarks.plain_training import framework_lambda, llama, optimizer_for, ours, read_recipe
from framework.config import ModelConfig, ParametrizationConfig
from framework.training.parametrization import optimizer_hyperparameters, param_groups
from tests.helpers.in_process import exit_code

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "quality_bar.py"


def recipe(tmp_path: Path, tau_ema: float = 0.5) -> Path:
    config = {"seed_everything": 0,
              "model": {"decoder": {"vocab_size": 300, "d_model": 16, "n_layers": 2, "n_heads": 2,
                                    "max_seq_len": 32, "init_std": 0.02},
                        "parametrization": {"kind": "complete_p", "d_base": 16, "n_layers_base": 2, "lr": 4e-3,
                                            "tau_ema": tau_ema},
                        "lr_schedule": {"warmup_steps": 1, "decay": "linear"}},
              "data": {"seq_len": 32, "batch_size": 4, "seed": 0}, "trainer": {"max_steps": 4}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def decayed(optimizer, model) -> set[str]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)] for group in optimizer.param_groups if group["weight_decay"] > 0 for p in group["params"]}


def test_framework_weight_decay_touches_exactly_the_block_matrices(tmp_path):
    settings = read_recipe(str(recipe(tmp_path)))
    model = ours(settings)
    assert decayed(optimizer_for(model, 4e-3, "framework", settings), model) == {
        f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.proj", "ffn.up", "ffn.down")}
    peer = llama(settings, 8)
    assert decayed(optimizer_for(peer, 4e-3, "framework", settings), peer) == {
        f"model.layers.{i}.{m}_proj.weight" for i in range(2)
        for m in ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "mlp.gate", "mlp.up", "mlp.down")}
    # the old baseline: every matrix, the embedding and the head included
    assert {"embed.weight", "head.weight"} <= decayed(optimizer_for(model, 4e-3, 0.1, settings), model)
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= decayed(optimizer_for(peer, 4e-3, 0.1, settings), peer)


def test_lambda_is_the_frameworks_per_tensor(tmp_path):
    settings = read_recipe(str(recipe(tmp_path)))  # τ_EMA 0.5, 4 steps
    for lr in (1.41e-3, 4e-3, 1.13e-2):
        assert framework_lambda(lr, settings) * lr * 0.5 * 4 == pytest.approx(1.0)
    # at m_d = m_L = 1 the framework's AdamW and ours agree tensor for tensor: η, ε, λ
    model = ours(settings)
    pcfg = ParametrizationConfig(kind="complete_p", d_base=16, n_layers_base=2, lr=4e-3, tau_ema=0.5)
    theirs = {id(p): (g["lr"], g["eps"], g["weight_decay"])
              for g in param_groups(model, pcfg, total_tokens=4.0, batch_tokens=1.0) for p in g["params"]}
    mine = {id(p): (g["lr"], g["eps"], g["weight_decay"])
            for g in optimizer_for(model, 4e-3, "framework", settings).param_groups for p in g["params"]}
    assert mine.keys() == theirs.keys() and all(mine[p] == pytest.approx(theirs[p]) for p in mine)
    # wider than its base the framework's hidden LR is η/m_d; η·λ stays 1/(τ_EMA·steps), as ours
    hidden = optimizer_hyperparameters(pcfg, ModelConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=2),
                                       total_tokens=4.0, batch_tokens=1.0)["hidden"]
    assert hidden["lr"] * hidden["weight_decay"] == pytest.approx(4e-3 * framework_lambda(4e-3, settings))


def quality_bar_process(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


@pytest.mark.slow
def test_seeds_confirm_jobs_and_resume(tmp_path, prepared_tokens, capsys):
    common = ["--config", str(recipe(tmp_path)), "--data", str(prepared_tokens), "--lrs", "1e-3", "4e-3",
              "--peer-lrs", "2e-3", "--heldout-tokens", "512"]
    one = quality_bar_process(*common, "--threads", "1", "--out", str(tmp_path / "one.json"))
    two = quality_bar_process(*common, "--threads", "1", "--confirm-seeds", "1", "--jobs", "2",
                              "--out", str(tmp_path / "two.json"))
    assert one.returncode == two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
    first, second = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    for kind in ("plain", "peer"):  # seed 0 is the recipe's; its rows do not depend on --jobs
        losses = [(r["lr"], r["heldout_loss"], r["final_train_loss"]) for r in first[kind]["rows"]]
        assert losses == [(r["lr"], r["heldout_loss"], r["final_train_loss"])
                          for r in second[kind]["rows"] if r["seed"] == 0]
        assert {r["weight_decay"] for r in second[kind]["rows"]} == {"framework"}
        top = second[kind]["best"]  # confirmed: two seeds, and still the lowest mean
        assert top["seeds"] == [0, 1] and top["edge"] is True  # two η or one: the optimum is at an end
        assert top["heldout_loss"] == min(p["heldout_loss"] for p in second[kind]["points"])
        pair = [r["heldout_loss"] for r in second[kind]["rows"] if r["lr"] == top["lr"]]
        assert top["std"] == pytest.approx(statistics.stdev(pair)) and pair[0] != pair[1]  # the seed sets the init
    assert second["plain"]["rows"][0]["lambda"] == pytest.approx(1 / (1e-3 * 0.5 * 4))
    assert second["partial"] is False and f"{top['heldout_loss']:.4f} ± {top['std']:.4f}" in two.stdout
    # a rerun trains nothing (in this process: nothing to train); other settings are refused
    assert quality_bar.main([*common, "--confirm-seeds", "1", "--out", str(tmp_path / "two.json")]) == 0
    again = capsys.readouterr().out
    assert "3 points done earlier" in again and "0 to train" in again and "held-out loss" not in again
    code, err = refusal([*common, "--steps", "3", "--out", str(tmp_path / "two.json")], capsys)
    assert code != 0 and "holds results of other settings" in err
    # --seeds 0 1 trains only the seed-1 rows the confirm did not make
    missing = 3 - sum(r["seed"] == 1 for kind in ("plain", "peer") for r in second[kind]["rows"])
    wider = quality_bar_process(*common, "--threads", "1", "--seeds", "0", "1", "--out", str(tmp_path / "two.json"))
    assert wider.returncode == 0 and wider.stdout.count("held-out loss") == missing


def hand_made(path: Path) -> None:
    """A finished grid's JSON with known numbers: ours best at η 2e-3 over two seeds, Llama at its grid's edge."""
    rows = {"plain": [(2e-3, 0, 4.70), (2e-3, 1, 4.72), (4e-3, 0, 4.80), (1e-3, 0, 4.90)],
            "peer": [(2e-3, 0, 4.75), (4e-3, 0, 4.65), (4e-3, 1, 4.67)]}
    result = {"settings": {"steps": 1000, "batch_size": 16, "seq_len": 128, "data_seed": 0, "tau_ema": 0.15},
              "heldout_tokens": 512, "lrs_all": [1e-3, 2e-3, 4e-3], "framework": None, "partial": False,
              "command": "benchmarks/quality_bar.py ..."}
    for kind, made in rows.items():
        made = [{"lr": lr, "weight_decay": "framework", "seed": seed, "heldout_loss": loss} for lr, seed, loss in made]
        result[kind] = {"non_embedding_params": 100, "rows": made, "points": quality_bar.points(made),
                        "best": quality_bar.best(made)}
    path.write_text(json.dumps(result))


def test_table_prints_mean_and_std_and_the_edge(tmp_path, capsys):
    hand_made(tmp_path / "grid.json")
    runs = []
    for seed, loss in ((0, 4.60), (1, 4.62)):
        run = tmp_path / f"dense,seed={seed}"
        (run / "evals").mkdir(parents=True)
        (run / "evals" / "heldout.json").write_text(json.dumps({"loss": loss, "tokens": 512}))
        (run / "recipe.yaml").write_text(yaml.safe_dump({"trainer": {"max_steps": 1000}, "model": {
            "parametrization": {"lr": 4e-3, "tau_ema": 0.15}}}))
        runs.append(str(run))
    assert quality_bar.main(["--table", "--framework", *runs, "--out", str(tmp_path / "grid.json")]) == 0
    shown = capsys.readouterr().out
    assert "| ours, plain AdamW loop | framework | 100 | 4.9000 | 4.7100 ± 0.0141 | 4.8000 | " \
           "4.7100 ± 0.0141 (η 0.002, 2 seeds) |" in shown
    assert "4.6600 ± 0.0141 (η 0.004, 2 seeds, edge) |" in shown
    verdict = next(line for line in shown.splitlines() if line.startswith("Verdict:"))
    assert f"4.6100 ± 0.0141 (2 runs) is {100 * (4.61 / 4.66 - 1):+.2f}% against the better baseline's " \
           "4.6600 ± 0.0141 (Llama, η 0.004, weight decay framework, 2 seeds): within the 1% bar" in verdict
    assert "Llama's optimum η 0.004 is at its grid's edge" in verdict


def refusal(argv: list[str], capsys) -> tuple[int, str]:
    code = exit_code(quality_bar.main, argv)
    err = capsys.readouterr().err
    return code, err if isinstance(code, int) else str(code)


@pytest.mark.parametrize("args, message", [
    (["--weight-decay", "framewrk"], "'framewrk' is invalid: expected 'framework' or a number >= 0"),
    (["--weight-decays", "framework", "-0.1"], "'-0.1' is invalid: a weight decay must be a finite number >= 0"),
    (["--seeds", "0", "-1"], "--seeds=-1 is invalid: a seed must be >= 0"),
    (["--confirm-seeds", "-2"], "--confirm-seeds=-2 is invalid: a seed must be >= 0"),
    (["--jobs", "0"], "--jobs=0 is invalid: must be >= 1"),
    (["--lrs", "-1"], "every η must be > 0"),
    (["--framework", "FRAMEWORK_RUN"], "--framework has τ_EMA 0.15, --config 0.5: the baselines' framework weight"),
    ([], "--config and --data are required"),
    (["--table", "--out", "/nonexistent/quality_bar.json"], "does not exist: run the grid first"),
])
def test_bad_arguments_are_one_line_errors_before_training(tmp_path, capsys, args, message):
    run = tmp_path / "framework-run"  # τ_EMA 0.15 where the recipe has 0.5
    (run / "evals").mkdir(parents=True)
    (run / "evals" / "heldout.json").write_text(json.dumps({"loss": 5.0, "tokens": 512}))
    (run / "recipe.yaml").write_text(yaml.safe_dump({"trainer": {"max_steps": 4}, "model": {
        "parametrization": {"lr": 4e-3, "tau_ema": 0.15}}}))
    needed = ["--config", str(recipe(tmp_path)), "--data", str(tmp_path)] if args else []
    code, err = refusal([*needed, *[str(run) if a == "FRAMEWORK_RUN" else a for a in args]], capsys)
    assert code == 2 and message in err.strip().splitlines()[-1] and "Traceback" not in err


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_file_it_did_not_write_is_never_replaced(tmp_path, capsys, overwrite):
    notes, folder = tmp_path / "notes.json", tmp_path / "a-folder"
    notes.write_text('{"mine": true}')
    folder.mkdir()
    for out in (notes, folder):
        _, err = refusal(["--config", str(recipe(tmp_path)), "--data", str(tmp_path), "--out", str(out), *overwrite],
                         capsys)
        assert re.search("is not this script's JSON: it is never replaced", err)
    assert notes.read_text() == '{"mine": true}' and not any(folder.iterdir())
