"""No recipe key is ignored: every key of the resolved `layerdrop pretrain` config,
set to a second value, changes something the run would do, or is refused. And
framework/recipes/recipe_keys.py (the keys a sweep may set) knows exactly those keys.

"Something the run would do" is observed, never read back from where the value was
stored: the model's parameters and forward, the drop plans, the optimizer's groups and
LR factors (model.*); the batches and loaders (data.*); what the callbacks do
(checkpoint.*, throughput.*, summary.*, guard.*, progress_every); the checkpoint a run resumes (resume); and,
for trainer.*, the arguments Lightning's Trainer receives (Lightning's own tests cover
what it does with them; ours cover the ones the framework transforms).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from framework.training.callbacks import Throughput
from framework.training.run_summary import RunSummary
from framework.training.checkpointing.saving import PeriodicCheckpoint
from framework.training.nonfinite import NonFiniteLossGuard
from framework.training.pretrain import PretrainCLI, build_cli, release_run_folders
from framework.families import FIELD_OWNERS
from framework.recipes.recipe_keys import recipe_keys
from framework.early_exit_loss import exit_weights
from framework.schedules import dropout_rates
from framework.training.progress import StepProgressLines
from tests.helpers.tiny_training import tiny_cli_args

RECIPES = Path(__file__).resolve().parents[2] / "recipes"

# The second value of each key whose type gives no obvious one (None defaults, names).
SECOND: dict[str, Any] = {
    "data.mixture": '{"a": {"dir": "data/a", "weight": 1}}',
    "data.mixture_schedule": '[{"from_step": 2, "weights": {"a": 1}}]',
    "trainer.accelerator": "gpu", "trainer.strategy": "ddp", "trainer.precision": "bf16-mixed",
    "trainer.logger": "false", "trainer.max_epochs": "3", "trainer.min_epochs": "1", "trainer.min_steps": "1",
    "trainer.max_time": "00:00:01:00", "trainer.limit_train_batches": "5", "trainer.limit_test_batches": "5",
    "trainer.limit_predict_batches": "5", "trainer.enable_checkpointing": "false", "trainer.gradient_clip_val": "1.0",
    "trainer.gradient_clip_algorithm": "value", "trainer.deterministic": "true", "trainer.benchmark": "true",
    "trainer.profiler": "simple", "trainer.model_registry": "my-model",
    "trainer.callbacks": json.dumps([{"class_path": "lightning.pytorch.callbacks.LearningRateMonitor"}]),
    "trainer.plugins": json.dumps({"class_path": "lightning.fabric.plugins.environments.LightningEnvironment"}),
    "model.decoder.attention": "flex", "model.decoder.head_dim": "8", "model.decoder.max_seq_len": "64",
    "model.decoder.d_model": "64", "model.decoder.n_heads": "4", "model.decoder.norm_eps": "0.5",
    "model.decoder.logit_multiplier": "0.3", "model.decoder.residual_multiplier": "0.3",
    "model.layer_dropout.distribution": "uniform",
    "model.layer_dropout.schedule": "constant", "model.layer_dropout.structure": "sublayer",
    "model.layer_dropout.mask": "count", "model.layer_dropout.r_train": "one",
    "model.parametrization.kind": "standard", "model.parametrization.betas": "[0.8, 0.9]",
    "model.lr_schedule.decay": "cosine", "model.lr_schedule.min_lr_ratio": "0.5",
    "model.lr_schedule.warmup_fraction": "0.25", "model.loss_chunk_tokens": "16",
    "model.early_exit_loss.exits": "[1]", "model.early_exit_loss.weighting": "linear",
    "model.early_exit_loss.curriculum": "gradual",
    "model.decoder.family": "llama", "model.decoder.n_kv_heads": "1", "model.decoder.ffn_hidden": "24",
    "model.decoder.rope_type": "llama3", "model.init_from": "/no/such/hf-folder",
    "data.data_dir": "/no/such/folder", "data.storage_options": json.dumps({"anon": True}), "data.seq_len": "16",
    "resume": "/no/such/last.ckpt",
}
# Set from another key, not settable: the data's vocabulary check uses the model's.
LINKED = {"data.model_vocab_size"}
# Keys that must be refused: their second value would be meaningless with the rest.
# (The curricula's knobs under the base's curriculum "none"; the other families' fields
# and grouped-query attention on the base's Celerity decoder, and family llama with the
# base's biases.)
LLAMA_FIELDS = {f"model.decoder.{name}" for name in ("family", "n_kv_heads", *FIELD_OWNERS)}
REFUSED = {"model.decoder.logit_multiplier", "model.decoder.residual_multiplier", "model.lr_schedule.warmup_fraction",
           "model.early_exit_loss.rotation", "model.early_exit_loss.ramp", "model.init_from", "data.data_dir",
           "resume", "data.mixture", "data.mixture_schedule"} | LLAMA_FIELDS  # a mixture beside the base's data_dir


class Captured(Exception):
    """Raised by the patched Trainer.__init__ with the arguments it was given."""


class CapturingCLI(PretrainCLI):
    """Builds everything as `layerdrop pretrain` does; keeps the Trainer's arguments.
    The parser is built once (a hundred configs parse in the time ten parsers build)."""

    parser_cache = None

    def setup_parser(self, *args: Any) -> None:
        if CapturingCLI.parser_cache is None:
            super().setup_parser(*args)
            CapturingCLI.parser_cache = self.parser
        self.parser = CapturingCLI.parser_cache

    def instantiate_trainer(self, **kwargs: Any) -> None:
        try:
            super().instantiate_trainer(**kwargs)
        except Captured as captured:
            self.trainer_kwargs = captured.args[0]


def second_value(key: str, value: Any, tmp_path: Path) -> str:
    if key in SECOND:
        return SECOND[key]
    if key == "trainer.default_root_dir":
        return str(tmp_path / "elsewhere")
    if key == "checkpoint.dirpath":
        return str(tmp_path / "ckpts")
    if key == "summary.compare_to":
        twin = tmp_path / "twin.json"
        twin.write_text(json.dumps({"val_loss": 1.0, "training_flops": 2.0}))
        return str(twin)
    if key == "throughput.peak_flops_per_device":
        return "1e12"
    if isinstance(value, bool):
        return str(not value).lower()
    if isinstance(value, int):
        return str(value + 1)
    if isinstance(value, float):
        return str(value * 0.5 if value else 0.25)
    raise AssertionError(f"no second value for {key}={value!r}: add one to SECOND")


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and key not in ("storage_options",):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resolved(cli) -> dict[str, Any]:
    return {k: v for k, v in leaves(cli.config.as_dict()).items()
            if k != "config" and "__path__" not in k and k not in LINKED}


# ------------------------------------------------------------------ what a run would do


def module_behaviour(module, max_steps: int) -> tuple:
    """Parameters after init, which kernel and cache the model has, drop plans at two
    steps, losses with and without a plan (and the step's early-exit loss), tensors kept
    for backward, the optimizer's groups and the LR factor of every step."""
    module.configure_model()
    model, cfg = module.model, module.model_cfg
    params = [(name, tuple(p.shape), float(p.detach().double().square().sum())) for name, p in model.named_parameters()]
    compiled = not hasattr(model.blocks[0].forward, "__self__")  # parallelize wrapped it
    trainer = pl.Trainer.__new__(pl.Trainer)
    REAL_TRAINER_INIT(trainer, accelerator="cpu", devices=1, max_steps=max_steps, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    module.trainer = trainer
    optimizer = module.configure_optimizers()
    groups = [(g["name"], g["lr"], g["eps"], g["weight_decay"], g["betas"]) for g in optimizer["optimizer"].param_groups]
    factor = optimizer["lr_scheduler"]["scheduler"].lr_lambdas[0]
    plans, losses, saved = [], [], []
    gen = torch.Generator().manual_seed(1)
    inputs, targets = torch.randint(0, cfg.vocab_size, (2, 4, 32), generator=gen)
    for step in (0, max_steps // 2):
        rates = dropout_rates(module.dropout_cfg, cfg.n_layers, step, max_steps)
        drop = module.drop_plan(rates, 4, step, 0)
        plans.append(None if drop is None else [(layer.attn_rows.tolist() if layer.attn_rows is not None else None,
                                                 layer.ffn_rows.tolist() if layer.ffn_rows is not None else None,
                                                 layer.scale) for layer in drop.layers])
        # A compiled block would compile on its first call (~20 s); FlexAttention has no
        # backward on CPU. Both are observed above (the wrapped forward, the kernel).
        if not compiled and not model.use_flex(None):
            sizes = []
            with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
                exits = exit_weights(module.exit_cfg, cfg.n_layers, step, max_steps)
                losses.append(float(module.loss(inputs, targets, drop, exits)))
            saved.append((len(sizes), max(sizes)))
    return (params, compiled, model.use_flex(None), model.new_cache(1).max_len, model.config.logit_multiplier,
            model.config.residual_multiplier, groups, [factor(t) for t in range(max_steps)], plans, losses, saved)


def data_behaviour(datamodule) -> tuple:
    datamodule.setup("fit")
    train, val = datamodule.train_dataloader(), datamodule.val_dataloader()
    first = next(iter(train))
    return (train.num_workers, train.batch_size, tuple(first[0].shape), int(first[0].sum()), len(val),
            json.dumps(train.dataset.storage_options, sort_keys=True))


def callback_behaviour(callbacks: list) -> list:
    out = []
    for cb in callbacks:
        if isinstance(cb, PeriodicCheckpoint):
            out.append(("checkpoint", cb.every_n_steps, cb.keep_last, cb.dirpath))
        elif isinstance(cb, NonFiniteLossGuard):
            out.append(("guard", cb.max_consecutive))
        elif isinstance(cb, Throughput):
            out.append(("throughput", cb.peak))
        elif isinstance(cb, RunSummary):
            out.append(("summary", json.dumps(cb._twin())))
        elif isinstance(cb, StepProgressLines):
            out.append(("progress lines", cb.every))
        else:
            out.append(type(cb).__name__)
    return out


def trainer_arguments(kwargs: dict) -> dict:
    plain = {k: v for k, v in kwargs.items() if k not in ("callbacks", "strategy", "plugins", "logger", "profiler")}
    for key in ("strategy", "plugins", "logger", "profiler"):
        value = kwargs.get(key)
        plain[key] = value if isinstance(value, (str, bool, type(None))) else type(value).__name__
    plain["callbacks"] = callback_behaviour(kwargs.get("callbacks") or [])
    return plain


def behaviour(cli, section: str) -> Any:
    max_steps = cli.trainer_kwargs["max_steps"]
    if section == "model" or section == "seed_everything":
        return module_behaviour(cli.model, max_steps)
    if section == "data":
        return data_behaviour(cli.datamodule)
    if section == "resume":
        return cli.ckpt_path
    return trainer_arguments(cli.trainer_kwargs)  # trainer.*, checkpoint.*, throughput.*, summary.*, guard.*


REAL_TRAINER_INIT = pl.Trainer.__init__


@pytest.fixture
def build(monkeypatch, prepared_tokens, tmp_path):
    @functools.wraps(REAL_TRAINER_INIT)  # LightningCLI reads the Trainer's arguments from its signature
    def fake_init(self, **kwargs):
        raise Captured(kwargs)

    monkeypatch.setattr(pl.Trainer, "__init__", fake_init)
    monkeypatch.setattr("framework.training.pretrain.PretrainCLI", CapturingCLI)
    monkeypatch.setattr(CapturingCLI, "parser_cache", None)
    # The tiny recipe, shrunk, on a width and depth other than the base's (m_d = m_L = 2),
    # so that every parametrization key has something to scale.
    # The early-exit loss is on, so that its keys have something to change.
    base = tiny_cli_args(prepared_tokens, tmp_path / "run") + [
        "--model.parametrization.d_base", "16", "--model.parametrization.n_layers_base", "1",
        "--model.early_exit_loss.scale", "0.5"]

    def make(*extra: str):
        try:
            return build_cli([*base, *extra])
        finally:
            release_run_folders()

    return make


def test_every_key_changes_what_runs_or_is_refused(build, tmp_path, capsys):
    baseline = build()
    keys = resolved(baseline)
    for recipe in sorted(RECIPES.glob("*.yaml")):  # every committed recipe resolves to these keys
        assert set(leaves(baseline.parser.parse_args(["--config", str(recipe)]).as_dict())) - {"config"} - LINKED \
            <= set(keys)
    reference: dict[str, Any] = {}
    ignored, wrongly_refused = [], []
    for key, value in keys.items():
        section = key.split(".")[0]
        if section not in reference:
            reference[section] = behaviour(build(), section)
        second = second_value(key, value, tmp_path)
        try:
            changed = behaviour(build(f"--{key}", second), section)
        except (ValueError, FileNotFoundError, SystemExit, pl.utilities.exceptions.MisconfigurationException) as err:
            message = f"{err} {capsys.readouterr().err}"
            if key not in REFUSED or (key.split(".")[-1] not in message and second not in message):
                wrongly_refused.append(f"{key}={second}: {message.strip().splitlines()[-1][:200]}")
            continue
        if key in REFUSED:
            wrongly_refused.append(f"{key}={second} was accepted")
        elif changed == reference[section]:
            ignored.append(f"{key}: {value!r} -> {second}")
    assert not ignored, f"keys that change nothing a run does: {ignored}"
    assert not wrongly_refused, f"refusals that are not the key's: {wrongly_refused}"
    assert len(keys) >= 90  # the whole resolved config, not a sample of it


# ------------------------------------------------------------------ framework/recipes/recipe_keys.py


def test_the_recipe_keys_are_the_resolved_configs(build):
    """The parser's keys, read without parsing anything, are the keys a built run resolves."""
    assert recipe_keys().leaves == set(resolved(build()))


@pytest.mark.parametrize("key, problem", [
    ("trainer.max_stepz", "'trainer.max_stepz' is not a recipe key (did you mean 'trainer.max_steps'?)"),
    ("data.batch_sise", "'data.batch_sise' is not a recipe key (did you mean 'data.batch_size'?)"),
    ("model.parametrization.lrr", "(did you mean 'model.parametrization.lr'?)"),
    ("trainer.max_steps.x", "'trainer.max_steps.x' is not a recipe key"),  # below a number
    ("data.model_vocab_size", "is not a recipe key"),  # set from model.decoder.vocab_size only
    ("zzz", "'zzz' is not a recipe key (see layerdrop pretrain --help)"),
    ("model.decoder", None), ("seed_everything", None), ("resume", None),
    ("data.storage_options.key", None),  # a dict's own keys
    ("trainer.strategy.init_args.stage", None), ("trainer.logger.init_args.save_dir", None),  # class_path/init_args
])
def test_a_key_is_a_recipe_key_or_named_with_the_nearest(key, problem):
    found = recipe_keys().problem(key)
    assert found == problem if problem is None else problem in found


def test_a_section_given_as_a_mapping_has_its_keys_checked():
    keys = recipe_keys()
    assert keys.first_unknown({"model.lr_schedule": {"warmup_steps": 1}, "model": {"decoder": {"d_model": 8}}}) is None
    assert keys.first_unknown({"trainer.max_steps": 3, "model": {"decoder": {"d_modl": 8}}}) == "model.decoder.d_modl"
    assert keys.first_unknown({"data.storage_options": {"anything": {"deeper": 1}}}) is None
