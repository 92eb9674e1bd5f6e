"""Every recipe parses with the `layerdrop pretrain` parser and instantiates; the paper
sizes build on the meta device with Table A.1's parameter counts, and their batch
size, steps and p_max follow the arithmetic their comments state."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from framework.config import LLAMA3_VOCAB_SIZE, ModelConfig, ParametrizationConfig
from framework.model import Decoder
from framework.parametrization import transfer_batch_size
from framework.pretrain import PretrainCLI, build_cli

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
# name -> (Table A.1 size in parameters, the paper's p_max for it)
PAPER = {"271m": (271e6, 0.4), "504m": (504e6, 0.4), "906m": (906e6, 0.4),
         "1.8b": (1.8e9, 0.6), "3.9b": (3.9e9, 0.8), "8.2b": (8.2e9, 0.99)}


class WithoutTrainer(PretrainCLI):
    """Parse and instantiate the model and data, but no Trainer (GPU recipes on a CPU)."""

    def instantiate_trainer(self, **kwargs):
        return None


def instantiate(recipe: Path, *extra: str, cli_class=WithoutTrainer):
    import framework.pretrain as pretrain

    original = pretrain.PretrainCLI
    pretrain.PretrainCLI = cli_class
    try:
        return build_cli(["--config", str(recipe), *extra])
    finally:
        pretrain.PretrainCLI = original


def parameters_on_meta(cli) -> int:
    with torch.device("meta"):
        cli.model.configure_model()
    assert cli.model.model.embed.weight.is_meta
    return cli.model.model.num_parameters()


def test_every_recipe_is_covered():
    assert sorted(p.stem for p in RECIPES.glob("*.yaml")) == sorted([*PAPER, "tiny", "tiny-dense"])


@pytest.mark.parametrize("name", list(PAPER))
def test_paper_recipe_builds_table_a1_and_follows_its_arithmetic(name):
    recipe = RECIPES / f"{name}.yaml"
    cli = instantiate(recipe)
    size, p_max = PAPER[name]
    n_params = parameters_on_meta(cli)
    assert abs(n_params / size - 1) < 0.02
    cfg = cli.model.model_cfg
    paper = ModelConfig.paper(name.upper())
    for key in ("d_model", "n_layers", "n_heads", "head_dim", "ffn_mult"):
        assert getattr(cfg, key) == getattr(paper, key)
    assert cfg.vocab_size == LLAMA3_VOCAB_SIZE == cli.datamodule.model_vocab_size

    layer_dropout = cli.model.dropout_cfg
    assert (layer_dropout.p_max, layer_dropout.distribution, layer_dropout.schedule) == \
        (p_max, "increasing", "decreasing")

    config = yaml.safe_load(recipe.read_text())
    trainer, data = config["trainer"], config["data"]
    batch = data["batch_size"] * trainer["devices"] * trainer["num_nodes"] * trainer.get("accumulate_grad_batches", 1)
    tokens_per_step = batch * data["seq_len"]
    # 20 tokens per parameter, in whole steps.
    assert trainer["max_steps"] == math.ceil(20 * n_params / tokens_per_step)
    # Power Lines: B = B_base · m_D^0.4, m_D = D/D_base = N/N_base at equal TPP; rounded
    # to whole sequences per GPU, within 10%.
    pcfg = cli.model.param_cfg
    with torch.device("meta"):
        n_base = Decoder(ModelConfig(vocab_size=LLAMA3_VOCAB_SIZE, d_model=pcfg.d_base,
                                     n_layers=pcfg.n_layers_base, n_heads=4)).num_parameters()
    rule = transfer_batch_size(pcfg, n_params / n_base)
    assert abs(batch / rule - 1) < 0.10
    assert config["throughput"]["peak_flops_per_device"] == pytest.approx(989.5e12)


@pytest.mark.parametrize("name", list(PAPER))
def test_paper_recipe_strategy_is_one_the_framework_builds(name):
    from framework.strategies import STRATEGIES, _check_combination

    trainer = yaml.safe_load((RECIPES / f"{name}.yaml").read_text())["trainer"]
    assert trainer["strategy"] in STRATEGIES
    _check_combination(trainer["strategy"], "gpu", trainer["devices"] * trainer["num_nodes"])


def test_tiny_recipe_instantiates_with_its_trainer(tmp_path):
    cli = instantiate(RECIPES / "tiny.yaml", "--trainer.default_root_dir", str(tmp_path), cli_class=PretrainCLI)
    assert cli.trainer.max_steps > 0 and cli.trainer.accumulate_grad_batches == 1
    assert 9e6 < parameters_on_meta(cli) < 13e6  # "a ~10M-parameter decoder"
    layer_dropout = cli.model.dropout_cfg
    assert (layer_dropout.p_max, layer_dropout.distribution, layer_dropout.schedule) == \
        (0.4, "increasing", "decreasing")
    assert cli.model.model_cfg.logit_multiplier == 1.0  # the base shape: m_d = m_L = 1


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
