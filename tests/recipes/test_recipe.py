"""`layerdrop recipe`: Table A.2's transfer rules, the strategy and micro-batch the
memory model picks (tests/recipes/test_device_memory.py checks the model itself), the
committed recipes it wrote, and its one-line refusals."""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path

import pytest
import yaml

from framework.config import LayerDropoutConfig, ModelConfig
from framework.flops import block_flops_per_token, head_flops_per_token
from framework.recipes.recipe import build, main
from framework.recipes.recipe_inputs import parameter_count, read_base
from framework.schedules import mean_dropout

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
COMMAND = "#   layerdrop recipe "


def generated() -> dict[str, list[str]]:
    """Committed recipe -> the command line its header says wrote it."""
    found = {}
    for path in sorted(RECIPES.glob("*.yaml")):
        line = next((line for line in path.read_text().splitlines() if line.startswith(COMMAND)), None)
        if line is not None:
            found[path.name] = shlex.split(line[len(COMMAND):])
    return found


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # the commands name the base recipe relative to the repository


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


BASE = ["--base", "recipes/base.yaml"]


def test_the_six_paper_recipes_are_generated():
    assert sorted(generated()) == ["1.8b.yaml", "271m.yaml", "3.9b.yaml", "504m.yaml", "8.2b.yaml", "906m.yaml"]


@pytest.mark.parametrize("name", sorted(generated()))
def test_each_committed_recipe_is_exactly_what_its_command_writes(name, in_repo):
    assert build(generated()[name]) == (RECIPES / name).read_text()


def test_the_base_recipe_is_a_base_at_20_tokens_per_parameter(in_repo):
    base = read_base("recipes/base.yaml")
    assert (base.model.d_model, base.model.n_layers) == (base.parametrization.d_base,
                                                         base.parametrization.n_layers_base)
    assert base.batch_size == 32 and base.seq_len == 2048
    assert base.steps == math.ceil(20 * base.parameters / (32 * 2048))


def test_table_a2_rules_for_a_size_that_is_not_the_papers(in_repo, capsys):
    code, out, _ = run(capsys, *BASE, "--d-model", "1024", "--n-layers", "20", "--heads", "8", "--tokens", "30B",
                       "--devices", "4", "--nodes", "1", "--memory", "80GB", "--p-max", "0.5",
                       "--distribution", "uniform", "--schedule", "constant")
    assert code == 0
    recipe = yaml.safe_load(out)
    base = read_base("recipes/base.yaml")
    model = ModelConfig(**recipe["model"]["decoder"])
    n = parameter_count(model)
    assert (model.d_model, model.n_layers, model.n_heads, model.head_dim) == (1024, 20, 8, 128)
    m_data = 30e9 / base.tokens
    per_device = round(32 * m_data ** 0.4 / 4)
    trainer, data = recipe["trainer"], recipe["data"]
    assert data["batch_size"] * trainer["accumulate_grad_batches"] == per_device
    assert trainer["max_steps"] == math.ceil(30e9 / (per_device * 4 * 2048))
    tau = recipe["model"]["parametrization"]["tau_ema"]
    assert tau == pytest.approx(0.2 * ((30e9 / n) / base.tpp) ** -0.5, rel=1e-3)
    assert recipe["model"]["layer_dropout"] == {**recipe["model"]["layer_dropout"], "p_max": 0.5,
                                                "distribution": "uniform", "schedule": "constant"}
    assert "# P̄ = 0.5: 50% of the blocks' training FLOPs saved" in out
    # Everything the rules do not derive is the base recipe's.
    assert recipe["model"]["lr_schedule"] == base.recipe["model"]["lr_schedule"]
    assert recipe["checkpoint"] == base.recipe["checkpoint"]


def strategy_of(capsys, *extra: str) -> dict:
    code, out, err = run(capsys, *BASE, "--tpp", "20", *extra)
    assert code == 0, err
    recipe = yaml.safe_load(out)
    return {"strategy": recipe["trainer"]["strategy"], "micro": recipe["data"]["batch_size"],
            "accumulate": recipe["trainer"]["accumulate_grad_batches"],
            "checkpointing": recipe["model"]["activation_checkpointing"]}


def share(size: str, devices: int) -> int:
    """Sequences per device of a 20-TPP run of ``size``: B = B_base·m_D^0.4 over the devices."""
    base, n = read_base("recipes/base.yaml"), parameter_count(ModelConfig.paper(size))
    return round(base.batch_size * (20 * n / base.tokens) ** 0.4 / devices)


def test_the_strategy_and_micro_batch_follow_the_memory(in_repo, capsys):
    roomy = strategy_of(capsys, "--size", "1.8B", "--devices", "8", "--nodes", "2", "--memory", "141GB")
    assert roomy == {"strategy": "ddp", "micro": share("1.8B", 16), "accumulate": 1, "checkpointing": False}
    # 40 GB: a full replica's weights and AdamW state (29 GB) leave no room to work: sharded
    sharded = strategy_of(capsys, "--size", "1.8B", "--devices", "8", "--nodes", "1", "--memory", "40GB")
    assert sharded["strategy"] == "fsdp" and not sharded["checkpointing"]
    assert strategy_of(capsys, "--size", "8.2B", "--devices", "8", "--nodes", "13",
                       "--memory", "141GB")["strategy"] == "hsdp"
    tight = strategy_of(capsys, "--size", "8.2B", "--devices", "8", "--nodes", "13", "--memory", "40GB")
    assert tight["micro"] * tight["accumulate"] == share("8.2B", 104) and (tight["checkpointing"] or tight["micro"] == 1)
    assert strategy_of(capsys, "--size", "271M", "--devices", "1", "--memory", "141GB")["strategy"] == "single"


@pytest.mark.parametrize("argv, message", [
    (["--size", "2B"], "^error: --size='2B' is invalid: allowed: 271M, 504M"),
    (["--size", "271M", "--d-model", "64"], "^error: --size and --d-model.* are invalid together"),
    (["--d-model", "64", "--heads", "4"], "^error: --size is missing"),
    (["--size", "271M", "--tpp", "20", "--tokens", "1B"], "^error: --tpp and --tokens are invalid together"),
    (["--size", "271M"], "^error: --tpp and --tokens .* both missing"),
    (["--size", "271M", "--tokens", "lots"], "^error: --tokens='lots' is invalid"),
    (["--size", "271M", "--tpp", "-1"], r"^error: --tpp=-1.0 is invalid: must be > 0"),
    (["--size", "271M", "--tpp", "20", "--memory", "141"], "^error: --memory='141' is invalid: .*unit"),
    (["--size", "271M", "--tpp", "20", "--devices", "0"], "^error: --devices=0 is invalid: must be >= 1"),
    (["--size", "271M", "--tpp", "20", "--p-max", "1.5"], r"^error: p_max=1.5 is invalid: must be in \[0, 1\)"),
    (["--d-model", "100", "--n-layers", "2", "--heads", "3", "--tpp", "20"], "^error: n_heads=3 is invalid"),
    (["--size", "8.2B", "--tpp", "20", "--devices", "1", "--memory", "16GB"],
     "^error: --memory='16GB' is invalid: one sequence per device, fully sharded .* add devices or nodes"),
])
def test_bad_input_is_one_line(in_repo, capsys, argv, message):
    defaults = {"--memory": "141GB"}
    extra = [x for k, v in defaults.items() if k not in argv for x in (k, v)]
    code, out, err = run(capsys, *BASE, *argv, *extra)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert re.search(message, err.strip()), err


def test_a_recipe_that_is_not_a_base_is_refused(in_repo, capsys):
    code, _, err = run(capsys, "--base", "recipes/271m.yaml", "--size", "504M", "--tpp", "20", "--memory", "141GB")
    assert code == 2 and "is invalid: a base recipe trains the parametrization's base model" in err
    code, _, err = run(capsys, "--base", "recipes/none.yaml", "--size", "504M", "--tpp", "20", "--memory", "141GB")
    assert code == 2 and err.startswith("error: --base='recipes/none.yaml' is invalid")


def test_out_is_written_and_never_overwritten_unasked(in_repo, capsys, tmp_path):
    out = tmp_path / "r.yaml"
    argv = [*BASE, "--size", "271M", "--tpp", "20", "--memory", "141GB", "--p-max", "0.4", "--out", str(out)]
    assert run(capsys, *argv)[0] == 0
    written = out.read_text()
    assert "default_root_dir: runs/r " in written and f"--out {out}" in written
    out.write_text("mine")
    code, _, err = run(capsys, *argv)
    assert code == 2 and "already exists; pass --overwrite" in err and out.read_text() == "mine"
    assert run(capsys, *argv, "--overwrite")[0] == 0 and out.read_text() == written


def test_the_flop_prediction_counts_layer_dropout_and_the_early_exit_heads(in_repo, capsys, tmp_path):
    """D · (blocks·(1 - P̄) + head·(1 + Ē)), with Ē the early-exit heads a step of the base
    recipe's curriculum at the new depth; the section itself is carried over."""
    base = yaml.safe_load((RECIPES / "base.yaml").read_text())
    base["model"]["early_exit_loss"] = {"scale": 0.3, "every": 4, "curriculum": "rotational", "rotation": 3}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    argv = ["--size", "271M", "--tokens", "1B", "--devices", "8", "--memory", "141GB", "--p-max", "0.4"]
    code, out, err = run(capsys, "--base", str(tmp_path / "base.yaml"), *argv)
    assert code == 0, err
    recipe = yaml.safe_load(out)
    assert recipe["model"]["early_exit_loss"] == base["model"]["early_exit_loss"]
    model, steps = ModelConfig(**recipe["model"]["decoder"]), recipe["trainer"]["max_steps"]
    exits = [4, 8, 12]  # 13 layers; rotation 3: one exit a step
    assert model.n_layers == 13
    p_bar = mean_dropout(LayerDropoutConfig(**recipe["model"]["layer_dropout"]), 13, steps)
    blocks = 13 * block_flops_per_token(model, 2048).blocks
    expected = 1e9 * (blocks * (1 - p_bar) + head_flops_per_token(model) * (1 + len(exits) / 3))
    line = next(line for line in out.splitlines() if line.startswith("#   FLOPs = "))
    assert float(line.rsplit("= ", 1)[1]) == pytest.approx(expected, rel=1e-3)
    assert "Ē = 1 early-exit heads a step" in out
    code, out, err = run(capsys, *BASE, *argv)
    assert "Ē = 0 early-exit heads a step" in out

    base["model"]["early_exit_loss"] = {"scale": 0.3, "exits": [6, 20]}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    code, _, err = run(capsys, "--base", str(tmp_path / "base.yaml"), *argv)
    assert code == 2 and "early_exit_loss.exits=[6, 20] is invalid: exits must be in 1..12" in err


def llama_base(tmp_path) -> str:
    """recipes/base.yaml as a tied Llama with grouped-query attention (2 query heads per K/V head)
    and a SwiGLU 4·d wide."""
    base = yaml.safe_load((RECIPES / "base.yaml").read_text())
    decoder = base["model"]["decoder"]
    decoder.update(family="llama", bias=False, attention="sdpa", n_kv_heads=decoder["n_heads"] // 2,
                   ffn_hidden=4 * decoder["d_model"], tie_embeddings=True, rope_theta=500000.0)
    (tmp_path / "llama-base.yaml").write_text(yaml.safe_dump(base))
    return str(tmp_path / "llama-base.yaml")


def test_a_llama_base_transfers_as_a_llama_priced_by_its_own_activations(in_repo, capsys, tmp_path):
    from framework.families.llama.blocks import LlamaBlock
    from framework.model.decoder import Block

    shape = ["--d-model", "2048", "--n-layers", "16", "--heads", "32", "--head-dim", "64", "--kv-heads", "8",
             "--ffn-hidden", "8192"]
    code, out, err = run(capsys, "--base", llama_base(tmp_path), *shape, "--tpp", "20", "--memory", "141GB")
    assert code == 0, err
    recipe = yaml.safe_load(out)
    model = ModelConfig(**recipe["model"]["decoder"])
    assert (model.family, model.n_kv_heads, model.ffn_hidden, model.tie_embeddings, model.rope_theta) == \
        ("llama", 8, 8192, True, 500000.0)
    assert parameter_count(model) == 1_235_814_400  # Llama-3.2-1B's published count
    assert "32 heads of 64 (8 key/value), FFN 8192" in out and "--kv-heads 8 --ffn-hidden 8192" in out
    micro = recipe["data"]["batch_size"]
    line = next(line for line in out.splitlines() if line.startswith("#   memory per device"))
    activations = float(re.search(r"activations ([0-9.]+)", line).group(1))
    llama, celerity = (micro * 2048 * 16 * block.activation_bytes_per_token(model, True) / 1e9
                       for block in (LlamaBlock, Block))
    assert activations == pytest.approx(llama, abs=0.05) and abs(activations - celerity) > 1


def test_a_llama_base_lends_its_grouping_and_ffn_width_per_d_model(in_repo, capsys, tmp_path):
    base = llama_base(tmp_path)
    code, out, err = run(capsys, "--base", base, "--d-model", "512", "--n-layers", "8", "--heads", "8",
                         "--tpp", "20", "--memory", "141GB")
    assert code == 0, err
    decoder = yaml.safe_load(out)["model"]["decoder"]
    assert (decoder["n_kv_heads"], decoder["ffn_hidden"]) == (4, 2048)
    assert "# the base's 2 query heads per key/value head" in out
    code, out, err = run(capsys, "--base", base, "--d-model", "512", "--n-layers", "8", "--heads", "3",
                         "--tpp", "20", "--memory", "141GB")
    assert code == 2 and out == "" and err.strip() == ("error: n_heads=3 is invalid: the base shares each key/value "
                                                       "head among 2 query heads; give --kv-heads")


def test_every_recipe_repeats_what_its_bases_hyperparameters_rest_on(in_repo, capsys, tmp_path):
    base_text = (RECIPES / "base.yaml").read_text()
    evidence = next(line for line in base_text.splitlines() if line.startswith("# What its hyperparameters rest on"))
    for name in generated():
        header = [line for line in (RECIPES / name).read_text().splitlines() if line.startswith("#")]
        assert "# The base recipe's η, σ and τ_EMA, as its header says:" in header
        assert "#   " + evidence[2:] in header and any("docs/tuning" in line for line in header)
    # a base that says nothing of where its values came from is called untuned, not trusted silently
    bare = "\n".join(line for line in base_text.splitlines() if not line.startswith("#"))
    (tmp_path / "bare.yaml").write_text(bare + "\n")
    code, out, err = run(capsys, "--base", str(tmp_path / "bare.yaml"), "--size", "271M", "--tpp", "20",
                         "--memory", "141GB")
    assert code == 0, err
    assert "does not say what its hyperparameters rest on" in out and "treat them as untuned" in out
