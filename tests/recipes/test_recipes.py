"""Every recipe parses with the `layerdrop pretrain` parser and instantiates; the
generated ones build on the meta device with the parameter count their header states
(Table A.1's shapes when the command named a paper size) and a strategy the framework
builds; the configs LightningCLI builds from them are the frozen dataclasses."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
import yaml

from framework.config import LLAMA3_VOCAB_SIZE, LayerDropoutConfig, ModelConfig, ParametrizationConfig
from framework.training.pretrain import PretrainCLI, build_cli
from framework.training.pretrain import main as pretrain
from tests.recipes.test_recipe import generated

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
# Table A.1 sizes, and the p_max the paper trained each at (0.4, then its hero runs).
PAPER = {"271M": (271e6, 0.4), "504M": (504e6, 0.4), "906M": (906e6, 0.4),
         "1.8B": (1.8e9, 0.6), "3.9B": (3.9e9, 0.8), "8.2B": (8.2e9, 0.99)}


class WithoutTrainer(PretrainCLI):
    """Parse and instantiate the model and data, but no Trainer (GPU recipes on a CPU)."""

    def instantiate_trainer(self, **kwargs):
        return None


def instantiate(recipe: Path, *extra: str, cli_class=WithoutTrainer):
    import framework.training.pretrain as pretrain_module

    original = pretrain_module.PretrainCLI
    pretrain_module.PretrainCLI = cli_class
    try:
        return build_cli(["--config", str(recipe), *extra])
    finally:
        pretrain_module.PretrainCLI = original
        pretrain_module.release_run_folders()  # the recipe's run folder, locked while the CLI was built


def parameters_on_meta(cli) -> int:
    with torch.device("meta"):
        cli.model.configure_model()
    assert cli.model.model.embed.weight.is_meta
    return cli.model.model.num_parameters()


def option(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_every_recipe_is_covered():
    assert sorted(p.name for p in RECIPES.glob("*.yaml")) == sorted([*generated(), "tiny.yaml", "tiny-dense.yaml",
                                                                      "base.yaml", "llama-continued.yaml",
                                                                      "cpu-base.yaml"])


def test_the_cpu_base_is_the_tunings_chosen_run():
    """recipes/cpu-base.yaml trains what docs/tuning's chosen run trained (the tune's
    tuned.yaml): the same model, parametrization, schedule and data shape."""
    chosen = yaml.safe_load((RECIPES.parent / "docs" / "tuning" / "runs" /
                             "lr=0.004,init_std=0.05,tau_ema=0.15,seed=0" / "config.yaml").read_text())
    cli = instantiate(RECIPES / "cpu-base.yaml")
    model, pcfg = cli.model.model_cfg, cli.model.param_cfg
    assert model == ModelConfig.from_dict(chosen["model"]["decoder"])
    for key in ("kind", "d_base", "n_layers_base", "lr", "tau_ema"):
        assert getattr(pcfg, key) == chosen["model"]["parametrization"][key], key
    assert cli.model.dropout_cfg.p_max == 0.0
    for key in ("seq_len", "batch_size", "seed"):
        assert getattr(cli.datamodule, key) == chosen["data"][key], key


@pytest.mark.parametrize("name", sorted(generated()))
def test_generated_recipe_instantiates_with_the_size_its_header_states(name):
    recipe = RECIPES / name
    cli = instantiate(recipe)
    n_params = parameters_on_meta(cli)
    stated = re.search(r"a decoder of ([0-9,]+) parameters", recipe.read_text()).group(1)
    assert n_params == int(stated.replace(",", ""))
    assert cli.model.model_cfg.vocab_size == LLAMA3_VOCAB_SIZE == cli.datamodule.model_vocab_size
    argv = generated()[name]
    size = option(argv, "--size")
    if size is not None:  # a paper size: Table A.1's shape, its parameter count, the paper's p_max
        paper = ModelConfig.paper(size)
        for key in ("d_model", "n_layers", "n_heads", "head_dim", "ffn_mult"):
            assert getattr(cli.model.model_cfg, key) == getattr(paper, key)
        assert abs(n_params / PAPER[size][0] - 1) < 0.02
        assert cli.model.dropout_cfg.p_max == PAPER[size][1]


@pytest.mark.parametrize("name", sorted(generated()))
def test_generated_recipe_strategy_is_one_the_framework_builds(name):
    from framework.strategies.registry import STRATEGIES, build_strategy

    trainer = yaml.safe_load((RECIPES / name).read_text())["trainer"]
    if trainer["strategy"] == "hsdp" and "hsdp" not in STRATEGIES:
        pytest.skip("strategy 'hsdp' is registered by the multi-node work (issue #12)")
    assert trainer["strategy"] in STRATEGIES
    build_strategy(trainer["strategy"], accelerator="gpu", devices=trainer["devices"] * trainer["num_nodes"])


def test_tiny_and_base_recipes_instantiate_with_their_trainer(tmp_path):
    cli = instantiate(RECIPES / "tiny.yaml", "--trainer.default_root_dir", str(tmp_path), cli_class=PretrainCLI)
    assert cli.trainer.max_steps > 0 and cli.trainer.accumulate_grad_batches == 1
    assert 9e6 < parameters_on_meta(cli) < 13e6  # "a ~10M-parameter decoder"
    layer_dropout = cli.model.dropout_cfg
    assert (layer_dropout.p_max, layer_dropout.distribution, layer_dropout.schedule) == \
        (0.4, "increasing", "decreasing")
    assert cli.model.model_cfg.logit_multiplier == 1.0  # the base shape: m_d = m_L = 1
    base = instantiate(RECIPES / "base.yaml")
    assert base.model.model_cfg.logit_multiplier == base.model.model_cfg.residual_multiplier == 1.0


def test_tiny_dense_differs_from_tiny_only_in_dropout_and_folder():
    tiny = yaml.safe_load((RECIPES / "tiny.yaml").read_text())
    dense = yaml.safe_load((RECIPES / "tiny-dense.yaml").read_text())
    assert dense["model"]["layer_dropout"].pop("p_max") == 0.0
    assert tiny["model"]["layer_dropout"].pop("p_max") == 0.4
    assert dense["trainer"].pop("default_root_dir") == "runs/tiny-dense"
    assert tiny["trainer"].pop("default_root_dir") == "runs/tiny"
    assert dense == tiny


def test_overrides_reach_the_module():
    cli = instantiate(RECIPES / "271m.yaml", "--model.layer_dropout.p_max", "0.2",
                      "--model.parametrization.kind", "standard")
    assert cli.model.dropout_cfg.p_max == 0.2
    assert cli.model.model_cfg.logit_multiplier == 1.0
    assert isinstance(cli.model.param_cfg, ParametrizationConfig) and cli.model.param_cfg.kind == "standard"


def test_lightning_cli_builds_the_frozen_configs_from_yaml_and_overrides():
    rates = "[0.0, 0.1, 0.2, 0.3, 0.4, 0.5]"
    cli = instantiate(RECIPES / "tiny.yaml", "--model.layer_dropout.distribution", rates,
                      "--model.layer_dropout.p_max", "0", "--model.decoder.init_std", "0.05")
    dropout, decoder = cli.model.dropout_cfg, cli.model.model_cfg
    assert isinstance(dropout, LayerDropoutConfig) and dropout.distribution == (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
    assert decoder.init_std == 0.05 and decoder.head_dim == 64
    for config, field in ((dropout, "p_max"), (decoder, "d_model"), (cli.model.param_cfg, "lr"),
                          (cli.model.lr_cfg, "decay")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(config, field, getattr(config, field))


@pytest.mark.parametrize("extra, message", [
    (["--model.layer_dropout.distribution", "[0.0, 0.1, 0.2, 0.3, 0.4, 0.5]"],
     "p_max=0.4 is invalid with an explicit distribution: the list gives every layer's rate; leave p_max out"),
    (["--model.layer_dropout.distribution", "[0.0, 0.1]", "--model.layer_dropout.p_max", "0"],
     r"layer_dropout.distribution=\[0.0, 0.1\] is invalid: an explicit list needs one rate per layer \(6\)"),
])
def test_a_meaningless_combination_is_refused_in_one_line(extra, message, tmp_path, capsys):
    capsys.readouterr()
    code = pretrain(["--config", str(RECIPES / "tiny.yaml"), "--trainer.default_root_dir", str(tmp_path), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and re.search(message, err), err
