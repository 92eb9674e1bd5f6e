"""A sweep file, the runs it expands to, and what each run is predicted to cost.

A sweep file (YAML) names a base recipe, the overrides every run shares, a grid of
dotted recipe keys crossed with each other and/or named runs with their own
overrides, the seeds, and the evaluations to run on each finished run:

    base: recipes/tiny.yaml                 # relative paths: from the working directory
    data:
      dir: data/builtin-2k                  # the prepared folder every run trains on
      prepare: [--corpus, builtin, --vocab-size, 2048]   # `layerdrop prepare` it if missing
    overrides: {trainer.max_steps: 3000, model.decoder.d_model: 64}
    grid: {model.layer_dropout.p_max: [0.2, 0.4]}        # crossed: one config per combination
    runs:                                   # named configs (any dotted keys; `seeds` optional)
      dense: {model.layer_dropout.p_max: 0.0, seeds: [0, 1, 2]}
    seeds: [0, 1]                           # every config is run once per seed ...
    seed_keys: [seed_everything, data.seed, model.layer_dropout.seed]   # ... set in these keys
    flops_matched:                          # dense trained to the others' FLOPs, its own full
      baseline: dense                       # schedule each (eval/experiments/sweep/compute_matched.py)
      to: ["*"]
    evals:                                  # `layerdrop <command> --ckpt … --data … --out …`
      - {name: heldout, command: eval heldout, args: {groups: 64}}
      - {name: skip, command: eval skip, args: {sweep: [middle, single]}, only: ["dense*"]}

A grid config is named from its overrides (``p_max=0.2``), a named one by its key, a
compute-matched one by its baseline and length (``dense-steps=900``); the run is the
config at one seed (``p_max=0.2,seed=0``). Everything here is pure: nothing
is launched or written (eval/experiments/sweep/runner.py does that).
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from eval.experiments.sweep.compute_matched import matched_configs
# re-exported: runner, results, dry_run and report/hyperparameter_curves read it here
from eval.experiments.sweep.dotted_keys import get_dotted  # noqa: F401
from framework.config import EarlyExitLossConfig, LayerDropoutConfig, ModelConfig
from framework.early_exit_loss import mean_exit_heads
from framework.files.nesting import yaml_document
from framework.flops import dense_step_flops
from framework.schedules import mean_dropout

DEFAULT_SEED_KEYS = ("seed_everything", "data.seed", "model.layer_dropout.seed")
TOP_KEYS = ("base", "data", "overrides", "grid", "runs", "flops_matched", "seeds", "seed_keys", "evals")
EVAL_KEYS = ("name", "command", "args", "only", "data")
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+,-]*$")
RECIPE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class SweepError(ValueError):
    """A sweep file that cannot run, with one line saying what and where."""


@dataclass(frozen=True)
class EvalSpec:
    """One evaluation after training: ``layerdrop <command> --ckpt C [--data D] --out O <args>``."""

    name: str
    command: str
    args: dict[str, Any] = field(default_factory=dict)
    only: tuple[str, ...] = ()  # run-name globs; empty: every run
    data: bool = True  # pass --data (downstream tasks take none)

    def applies_to(self, run_name: str) -> bool:
        return not self.only or any(fnmatch.fnmatchcase(run_name, pattern) for pattern in self.only)


@dataclass(frozen=True)
class Run:
    """A configuration at one seed."""

    name: str  # the run's folder name
    config_name: str  # the configuration without the seed
    overrides: dict[str, Any]  # dotted key -> value (the sweep's shared ones first)
    seed: int
    matches: tuple[str, ...] = ()  # a compute-matched run: the configurations whose FLOPs it is trained to


@dataclass
class Sweep:
    path: Path
    base: Path
    data_dir: Path
    prepare: list[str]
    runs: list[Run]
    evals: list[EvalSpec]
    seed_keys: tuple[str, ...]
    text: str  # the file as written (copied into the sweep folder)


# ----------------------------------------------------------------------- parsing
def load_sweep(path: str | Path, *, data_dir: str | None = None) -> Sweep:
    """Read and validate a sweep file; ``data_dir`` replaces its ``data.dir``."""
    spec, text = read_spec(path)
    return sweep_of(spec, Path(path), text, data_dir=data_dir)


def read_spec(path: str | Path) -> tuple[dict, str]:
    """A sweep-like file's YAML mapping and its text."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        spec = yaml_document(text, f"sweep file {str(path)!r}")
    except yaml.YAMLError as err:
        raise SweepError(f"sweep file {str(path)!r} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(spec, dict):
        raise SweepError(f"sweep file {str(path)!r} must be a mapping with keys {', '.join(TOP_KEYS)}")
    return spec, text


def sweep_of(spec: dict, path: Path, text: str, *, data_dir: str | None = None, extra_keys: tuple[str, ...] = (),
             configs: list[tuple[str, dict[str, Any], list[int] | None]] | None = None) -> Sweep:
    """The Sweep a parsed file describes. A caller that plans the configurations itself
    (`layerdrop tune`) passes them as ``configs`` (name, overrides, seeds or None) and
    names the top-level keys it reads in ``extra_keys``."""
    unknown = sorted(set(spec) - set(TOP_KEYS) - set(extra_keys))
    if unknown:
        raise SweepError(f"sweep file keys {unknown} are invalid: allowed: {', '.join((*TOP_KEYS, *extra_keys))}")
    base = Path(_required(spec, "base", str))
    if not base.is_file():
        raise SweepError(f"base recipe {str(base)!r} does not exist (relative paths are from the working directory)")
    data = spec.get("data") or {}
    if not isinstance(data, dict) or not (data_dir or data.get("dir")):
        raise SweepError("data is invalid: expected a mapping with dir (the prepared folder) and optional prepare")
    prepare = [str(a) for a in data.get("prepare") or []]
    seeds = _seeds(spec.get("seeds", [0]), "seeds")
    seed_keys = tuple(spec.get("seed_keys") or DEFAULT_SEED_KEYS)
    shared = _overrides(spec.get("overrides") or {}, "overrides")
    check_keys(_base_recipe(base), f"base recipe {str(base)!r}")
    check_keys(shared, "overrides")
    check_keys(dict.fromkeys(seed_keys), "seed_keys")
    if configs is None:
        configs = _grid_configs(spec.get("grid") or {}) + _named_configs(spec.get("runs") or {}, seeds)
        if not configs:
            raise SweepError("the sweep has no runs: give a grid, named runs, or both")
    matches: dict[str, tuple[str, ...]] = {}
    if spec.get("flops_matched") is not None:
        for name, overrides, config_seeds, targets in _flops_matched(spec["flops_matched"], configs, seeds, base,
                                                                       shared):
            configs = [*configs, (name, overrides, config_seeds)]
            matches[name] = targets
    names = [name for name, _, _ in configs]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise SweepError(f"configuration names {duplicated} appear twice: rename the runs")
    runs = [Run(f"{name},seed={seed}", name, {**shared, **overrides}, seed, matches.get(name, ()))
            for name, overrides, config_seeds in configs for seed in (config_seeds or seeds)]
    return Sweep(path=path, base=base, data_dir=Path(data_dir or data["dir"]), prepare=prepare, runs=runs,
                 evals=parse_evals(spec.get("evals") or []), seed_keys=seed_keys, text=text)


def _flops_matched(block: Any, configs: list, seeds: list[int], base: Path, shared: dict[str, Any]) -> list:
    """The compute-matched configurations the file's ``flops_matched`` block asks for."""
    def recipe_of(overrides: dict[str, Any]) -> dict:
        recipe = _base_recipe(base)
        for key, value in {**shared, **overrides}.items():
            set_dotted(recipe, key, value)
        return recipe

    try:
        return matched_configs(block, configs, seeds, recipe_of, predict)
    except SweepError:
        raise
    except ValueError as err:
        raise SweepError(str(err)) from None


def check_keys(settings: dict[str, Any], where: str) -> None:
    """Refuse a key `layerdrop pretrain` does not have, naming the nearest one (before
    any run folder is written; `pretrain --print_config` would say it per run, later)."""
    # Lightning's import (seconds), paid where a sweep file is read, not by `layerdrop report`.
    from framework.recipes.recipe_keys import recipe_keys

    keys = recipe_keys()
    unknown = keys.first_unknown(settings)
    if unknown is not None:
        raise SweepError(f"{where} key {keys.problem(unknown)}")


def _base_recipe(base: Path) -> dict:
    try:
        recipe = yaml_document(base.read_text(), f"base recipe {str(base)!r}") or {}
    except yaml.YAMLError as err:
        raise SweepError(f"base recipe {str(base)!r} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(recipe, dict):
        raise SweepError(f"base recipe {str(base)!r} is invalid: expected a mapping of recipe sections")
    return recipe


def _required(spec: dict, key: str, kind: type) -> Any:
    value = spec.get(key)
    if not isinstance(value, kind):
        raise SweepError(f"{key}={value!r} is invalid: expected a {kind.__name__}")
    return value


def _seeds(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(s, int) and s >= 0 for s in value) \
            or len(set(value)) != len(value):
        raise SweepError(f"{where}={value!r} is invalid: expected a list of distinct integers >= 0")
    return list(value)


def _overrides(value: Any, where: str, *, recipe_keys: bool = True) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
        raise SweepError(f"{where}={value!r} is invalid: expected a mapping of dotted recipe keys to values")
    for key in value if recipe_keys else ():
        if not RECIPE_KEY.match(key):
            raise SweepError(f"{where} key {key!r} is invalid: expected identifiers joined by '.' "
                             "(e.g. model.decoder.d_model)")
    return dict(value)


def _grid_configs(grid: Any) -> list[tuple[str, dict[str, Any], list[int] | None]]:
    grid = _overrides(grid, "grid")
    if not grid:
        return []
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"grid.{key}={values!r} is invalid: expected a non-empty list of values")
        for value in values:
            check_keys({key: value}, "grid")
    keys = list(grid)
    labels = short_keys(keys)
    configs = []
    for values in itertools.product(*(grid[k] for k in keys)):
        overrides = dict(zip(keys, values))
        configs.append((config_name(overrides, labels), overrides, None))
    return configs


def _named_configs(runs: Any, default_seeds: list[int]) -> list[tuple[str, dict[str, Any], list[int] | None]]:
    if not isinstance(runs, dict):
        raise SweepError(f"runs={runs!r} is invalid: expected a mapping of run names to overrides")
    configs = []
    for name, overrides in runs.items():
        if not isinstance(name, str) or not SAFE_NAME.match(name):
            raise SweepError(f"run name {name!r} is invalid: use letters, digits and . _ = + , - "
                             "(it names a folder)")
        overrides = dict(_overrides(overrides or {}, f"runs.{name}"))
        seeds = _seeds(overrides.pop("seeds"), f"runs.{name}.seeds") if "seeds" in overrides else None
        check_keys(overrides, f"runs.{name}")
        configs.append((name, overrides, seeds))
    return configs


def short_keys(keys: list[str]) -> dict[str, str]:
    """The shortest dotted suffix of each key that tells the keys apart (p_max, decoder.d_model)."""
    labels = {}
    for key in keys:
        parts = key.split(".")
        for size in range(1, len(parts) + 1):
            label = ".".join(parts[-size:])
            if sum(1 for other in keys if other == label or other.endswith("." + label)) == 1:
                break
        labels[key] = label
    return labels


def config_name(overrides: dict[str, Any], labels: dict[str, str]) -> str:
    """A grid configuration's name: ``lr=0.002,init_std=0.02`` (labels from short_keys)."""
    return ",".join(f"{labels[k]}={_value_label(v)}" for k, v in overrides.items())


def _value_label(value: Any) -> str:
    text = ("-".join(map(_value_label, value)) if isinstance(value, list) else str(value)).replace("/", "_")
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)


def parse_evals(evals: Any) -> list[EvalSpec]:
    if not isinstance(evals, list):
        raise SweepError(f"evals={evals!r} is invalid: expected a list of {{name, command, args}}")
    specs = []
    for index, entry in enumerate(evals):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) \
                or not isinstance(entry.get("command"), str):
            raise SweepError(f"evals[{index}]={entry!r} is invalid: expected a mapping with name and command")
        unknown = sorted(set(entry) - set(EVAL_KEYS))
        if unknown:
            raise SweepError(f"evals[{index}] keys {unknown} are invalid: allowed: {', '.join(EVAL_KEYS)}")
        if not SAFE_NAME.match(entry["name"]):
            raise SweepError(f"evals[{index}].name={entry['name']!r} is invalid: it names a file")
        only = entry.get("only") or []
        args = _overrides(entry.get("args") or {}, f"evals[{index}].args", recipe_keys=False)
        specs.append(EvalSpec(entry["name"], entry["command"], args,
                              tuple(only if isinstance(only, list) else [only]), bool(entry.get("data", True))))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise SweepError(f"eval names {names} are invalid: each must be distinct")
    return specs


# -------------------------------------------------------------------- run configs
def set_dotted(config: dict, key: str, value: Any) -> None:
    """config["a"]["b"]["c"] = value for key "a.b.c", creating the sections on the way."""
    node = config
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SweepError(f"override {key!r} is invalid: {part!r} is a value, not a section, in the recipe")
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def run_recipe(sweep: Sweep, run: Run, run_dir: Path) -> dict:
    """The base recipe with the run's overrides, seed, folder and data applied."""
    recipe = _base_recipe(sweep.base)
    for key, value in run.overrides.items():
        set_dotted(recipe, key, value)
    for key in sweep.seed_keys:
        set_dotted(recipe, key, run.seed)
    set_dotted(recipe, "trainer.default_root_dir", str(run_dir))
    set_dotted(recipe, "data.data_dir", str(sweep.data_dir))
    return recipe


# -------------------------------------------------------------------- predictions
@dataclass(frozen=True)
class Prediction:
    """What a run will cost, from its recipe alone (before anything runs)."""

    mean_dropout: float  # P̄: predicted fraction of non-embedding training FLOPs saved
    training_flops: float  # total: blocks × (1 - P̄) + the head × (1 + early-exit heads a step)
    dense_training_flops: float  # the same without layer dropout (the early-exit heads still run)
    tokens: int
    non_embedding_params: int
    non_embedding_flops: float = 0.0  # the blocks' executed FLOPs (the paper's "FLOPs"; summary.json's training_flops)
    head_flops: float = 0.0  # one unembedding on every training token
    exit_heads: float = 0.0  # early-exit heads a step, on average over the run

    @property
    def tokens_per_parameter(self) -> float:
        return self.tokens / self.non_embedding_params

    @property
    def dense_total_flops(self) -> float:
        """A plain dense run of the same tokens: every block on every row, one head."""
        return self.dense_training_flops - self.head_flops * self.exit_heads

    @property
    def flops_saved_pct(self) -> float:
        """Of the total training FLOPs against a plain dense run (negative: the run costs more)."""
        return 100.0 * (1.0 - self.training_flops / self.dense_total_flops)


def predict(recipe: dict) -> Prediction:
    """P̄ and training FLOPs of a recipe (framework.schedules / framework.flops)."""
    decoder = dict(get_dotted(recipe, "model.decoder", {}))
    _known_fields(decoder, ModelConfig, "model.decoder", ("logit_multiplier", "residual_multiplier"))
    for section, config in (("model.layer_dropout", LayerDropoutConfig),
                            ("model.early_exit_loss", EarlyExitLossConfig)):
        _known_fields(get_dotted(recipe, section) or {}, config, section)
    model_cfg = ModelConfig(**{k: v for k, v in decoder.items() if k not in ("logit_multiplier",
                                                                               "residual_multiplier")})
    dropout = LayerDropoutConfig(**(get_dotted(recipe, "model.layer_dropout") or {}))
    steps = int(get_dotted(recipe, "trainer.max_steps", 0) or 0)
    if steps < 1:
        raise SweepError("trainer.max_steps is missing: a sweep's runs need their length (P̄ and FLOPs depend on it)")
    seq_len = int(get_dotted(recipe, "data.seq_len", 256))
    batch = int(get_dotted(recipe, "data.batch_size", 16))
    devices = get_dotted(recipe, "trainer.devices", 1)
    devices = devices if isinstance(devices, int) else 1
    sequences = batch * devices * int(get_dotted(recipe, "trainer.num_nodes", 1) or 1) \
        * int(get_dotted(recipe, "trainer.accumulate_grad_batches", 1) or 1)
    exits = EarlyExitLossConfig(**(get_dotted(recipe, "model.early_exit_loss") or {}))
    heads = mean_exit_heads(exits, model_cfg.n_layers, steps)
    step = dense_step_flops(model_cfg, sequences, seq_len)
    p_bar = mean_dropout(dropout, model_cfg.n_layers, steps)
    heads_flops = step.head * (1 + heads)  # the final head and the early-exit heads
    return Prediction(mean_dropout=p_bar, training_flops=steps * (step.blocks * (1 - p_bar) + heads_flops),
                      dense_training_flops=steps * (step.blocks + heads_flops), tokens=steps * sequences * seq_len,
                      non_embedding_params=non_embedding_parameters(model_cfg),
                      non_embedding_flops=steps * step.blocks * (1 - p_bar), head_flops=steps * step.head,
                      exit_heads=heads)


def _known_fields(section: dict, config: type, where: str, extra: tuple[str, ...] = ()) -> None:
    """Refuse a key the section's config does not have (before a run folder is written)."""
    allowed = {f.name for f in dataclasses.fields(config)} | set(extra)
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise SweepError(f"{where}.{unknown[0]} is not a recipe key: "
                         f"allowed under {where}: {', '.join(sorted(allowed))}")


def non_embedding_parameters(model_cfg: ModelConfig) -> int:
    """Parameters of the blocks and the final norm (what TPP counts in the paper: no
    embedding, no unembedding)."""
    import torch

    from framework.model.decoder import Decoder

    with torch.device("meta"):
        decoder = Decoder(model_cfg)
    return sum(p.numel() for name, p in decoder.named_parameters()
               if not (name.startswith("embed.") or name.startswith("head.")))


def format_flops(value: float) -> str:
    if value <= 0 or not math.isfinite(value):
        return f"{value:g}"
    exponent = int(math.floor(math.log10(value)))
    return f"{value / 10 ** exponent:.2f}e{exponent}"


__all__ = ["Sweep", "Run", "EvalSpec", "SweepError", "parse_evals", "Prediction", "load_sweep", "read_spec", "sweep_of", "check_keys",
           "config_name", "run_recipe", "predict",
           "set_dotted", "get_dotted", "short_keys", "non_embedding_parameters", "format_flops"]
