"""The quality bar: is the framework's tuned dense default as good as plain AdamW and a peer?

Two baselines trained on exactly the framework run's tokens, each over an η grid
(benchmarks/plain_training.py holds the models and the loop):

  (a) ours, plain: the same Decoder (framework/model/decoder.py), trained by a plain PyTorch
      loop: no Lightning, no parametrization (one LR, one ε, one init std, multipliers 1),
      torch.optim.AdamW, the recipe's warmup then decay;
  (b) a peer nobody here wrote: transformers' LlamaForCausalLM (RMSNorm, RoPE, SwiGLU,
      untied head) of the recipe's width, depth and heads, its MLP sized so that its
      non-embedding parameters match ours, trained by the same loop.

Same batches in the same order (framework.training.data.TokenDataModule over the same litdata
chunks with the recipe's data.seed), the same number of steps, and the same held-out tokens
as the sweeps' `eval heldout` (eval/inputs.py's ValidationData spread over the val split; by
default as many as the --framework runs' evals/heldout.json measured). The framework's own
number is read from finished runs (--framework RUN_DIR...: their evals/heldout.json, mean ±
std over the runs), so nothing here re-implements it. The bar (issue 18): the framework
within 1% of the better baseline at its best η.

Weight decay (--weight-decay, a list: every grid point is trained at each):
  framework  (the default) the framework's own: decoupled AdamW decay on the transformer
             blocks' matrices only (never embeddings, head, norms, biases) with
             λ = 1/(η·τ_EMA·steps), τ_EMA the recipe's model.parametrization.tau_ema, so η·λ is
             the framework's η_hidden·λ at every η;
  0.1 …      that λ on every matrix, embedding and head included (the old baseline); a list
             such as `--weight-decay framework 0.1 0.3 1 1.67` is a weight-decay sweep.

Seeds: --seeds trains every grid point at each seed (the seed sets the init; the data order
is the recipe's data.seed for all); --confirm-seeds then trains those seeds at each baseline's
best (η, weight decay), again until the best has them all (a point that a second seed makes
worse hands the best to the next). Rows are keyed by (trainer, η, weight decay, seed) and all
are kept; a point's loss is its mean over seeds, ± the sample std where it has more than one;
the best is the lowest mean; an optimum at the end of its η grid is marked "edge".

What differs from the framework's run, and what is measured: at recipes/cpu-base.yaml's
m_d = m_L = 1 (d_base = d_model, n_layers_base = n_layers) Table A.2's rules give every tensor
the same η, ε, betas and init σ and every multiplier 1, so with `framework` weight decay the
plain loop's AdamW is the framework's tensor for tensor (tests/benchmarks/test_quality_bar.py
compares the two optimizers' groups parameter by parameter). What remains between ours-plain
and the framework's run is the init's random draws (torch.manual_seed here, Lightning's
seed_everything there) and the loop (Lightning's, with its non-finite-step guard, its chunked
loss, and a layer-dropout path that at p_max 0 drops nothing): the plain row at the
framework's η measures their sum, to be read against the seed std. The Llama peer differs in
architecture as well. A numeric weight decay differs from the framework's in both the tensors
and λ.

    .venv/bin/python benchmarks/quality_bar.py --config recipes/cpu-base.yaml --data data/builtin-2k \\
        --seeds 0 --confirm-seeds 1 --framework "docs/reproduction/runs/dense,seed=0" --jobs 2 --threads 1
    .venv/bin/python benchmarks/quality_bar.py --table      # the BENCHMARKS.md table from the JSON
    .venv/bin/python benchmarks/quality_bar.py --table --framework RUN_DIR...  # set (or replace) the framework's row

Writes benchmarks/results/quality_bar.json (every row, each point's mean ± std, the model
sizes, the settings and the command); running the same command again after an interruption
trains only the rows it lacks.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import multiprocessing
import shlex
import statistics
import sys
from pathlib import Path
from typing import Callable

import torch
import yaml

from harness import write_results  # noqa: E402  (first: the repository's packages)
from benchmarks.plain_training import (FRAMEWORK, framework_lambda, llama, matched_intermediate,  # noqa: E402
                                       non_embedding, ours, point, read_recipe, weight_decay_mode)

RESULTS = Path(__file__).parent / "results" / "quality_bar.json"
BAR = 0.01  # the framework within 1% of the better baseline
LRS = [1.41e-3, 2e-3, 2.83e-3, 4e-3, 5.66e-3, 8e-3, 1.13e-2]  # √2 apart, 3 significant digits
NAMES = {"plain": "ours, plain AdamW", "peer": "Llama"}
LABELS = {"plain": "ours, plain AdamW loop", "peer": "LlamaForCausalLM (transformers), AdamW"}
Key = tuple  # (trainer, η, weight decay, seed)


# --------------------------------------------------------------------- statistics
def key_of(kind: str, row: dict) -> Key:
    return kind, float(row["lr"]), row["weight_decay"], int(row["seed"])


def points(rows: list[dict]) -> list[dict]:
    """Each (η, weight decay) of a trainer: its seeds, mean and sample std (None for one seed)."""
    grouped: dict[tuple, list[dict]] = {}
    for row in rows:
        grouped.setdefault((row["lr"], row["weight_decay"]), []).append(row)
    out = []
    for (lr, mode), members in sorted(grouped.items(), key=lambda item: (str(item[0][1]), item[0][0])):
        losses = [r["heldout_loss"] for r in sorted(members, key=lambda r: r["seed"])]
        finite = all(map(math.isfinite, losses))
        out.append({"lr": lr, "weight_decay": mode, "seeds": sorted(r["seed"] for r in members),
                    "heldout_loss": statistics.fmean(losses) if finite else math.inf,
                    "std": statistics.stdev(losses) if finite and len(losses) > 1 else None})
    return out


def best(rows: list[dict]) -> dict | None:
    """The lowest-mean point, with ``edge``: its η is the lowest or highest trained at its weight decay."""
    candidates = [p for p in points(rows) if math.isfinite(p["heldout_loss"])]
    if not candidates:
        return None
    top = min(candidates, key=lambda p: p["heldout_loss"])
    lrs = [r["lr"] for r in rows if r["weight_decay"] == top["weight_decay"]]
    return {**top, "edge": top["lr"] in (min(lrs), max(lrs))}


def mean_text(point: dict) -> str:
    text = "diverged" if point["heldout_loss"] == math.inf else f"{point['heldout_loss']:.4f}"
    return text + (f" ± {point['std']:.4f}" if point.get("std") is not None else "")


def wd_text(mode: str | float) -> str:
    return "framework" if mode == FRAMEWORK else f"{mode:g}"


# -------------------------------------------------------------------------- grid
def train_rows(tasks: list[Key], settings: dict, intermediate: int, args, rows: dict[Key, dict],
               save: Callable[[dict], None]) -> None:
    """Every task, ``args.jobs`` at a time (spawned processes: a forked torch with live threads
    can deadlock); ``save(rows)`` after each, so an interrupted grid is finished later."""

    def done(key: Key, row: dict) -> None:
        rows[key] = row
        save(rows)
        kind, lr, mode, seed = key
        print(f"{NAMES[kind]} η={lr:g} wd={wd_text(mode)} seed={seed}: held-out loss {row['heldout_loss']:.4f} "
              f"(train {row['final_train_loss']:.4f}, {row['cpu_seconds']} CPU s)", flush=True)

    if args.jobs == 1:
        for key in tasks:
            done(key, point(*key, settings, intermediate, args))
        return
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        futures = {pool.submit(point, *key, settings, intermediate, args): key for key in tasks}
        for future in concurrent.futures.as_completed(futures):
            done(futures[future], future.result())


def grid_tasks(args) -> list[Key]:
    grids = {"plain": args.lrs, "peer": args.peer_lrs}
    return [(kind, lr, mode, seed) for kind, lrs in grids.items() for lr in lrs
            for mode in args.weight_decay for seed in args.seeds]


def confirm_tasks(rows: dict[Key, dict], confirm_seeds: list[int]) -> list[Key]:
    """The confirm seeds each trainer's best point still lacks."""
    tasks = []
    for kind in NAMES:
        top = best([row for key, row in rows.items() if key[0] == kind])
        if top:
            tasks += [(kind, top["lr"], top["weight_decay"], seed) for seed in confirm_seeds
                      if (kind, top["lr"], top["weight_decay"], seed) not in rows]
    return tasks


def earlier_rows(out: Path, record: dict, overwrite: bool) -> dict[Key, dict]:
    """The rows an earlier run of the same settings (paths aside) wrote to ``out``
    (none with --overwrite, which replaces only a file this script wrote); a file of other
    settings is never replaced unasked, and nothing this script did not write ever is."""
    if not out.exists():
        return {}
    try:
        earlier = json.loads(out.read_text()) if out.is_file() else None
    except (ValueError, UnicodeDecodeError):
        earlier = None
    mine = isinstance(earlier, dict) and isinstance(earlier.get("settings"), dict) and \
        all(isinstance(earlier.get(kind), dict) and isinstance(earlier[kind].get("rows"), list) for kind in NAMES)
    if not mine:
        raise SystemExit(f"--out {str(out)!r} exists and is not this script's JSON: it is never replaced "
                         "(even with --overwrite); choose another --out")
    if overwrite:
        return {}
    paths = ("config", "data")  # where the files are on this machine: a grid may be finished on another
    if {k: v for k, v in earlier["settings"].items() if k not in paths} != \
            {k: v for k, v in record.items() if k not in paths}:
        raise SystemExit(f"--out {str(out)!r} holds results of other settings: pass --overwrite to replace it, "
                         "or another --out")
    return {key_of(kind, row): row for kind in NAMES for row in earlier[kind]["rows"]}


# ------------------------------------------------------------------------- output
def framework_result(run_dirs: list[str] | None) -> dict | None:
    """The framework's row: mean ± std of the runs' evals/heldout.json, with their recipe's η, τ_EMA, steps."""
    if not run_dirs:
        return None
    losses, tokens, recipes = [], set(), []
    for run in run_dirs:
        report = Path(run) / "evals" / "heldout.json"
        if not report.is_file():
            raise ValueError(f"--framework {run!r} is invalid: it has no evals/heldout.json (a finished sweep run)")
        held = json.loads(report.read_text())
        losses.append(float(held["loss"]))
        tokens.add(held["tokens"])
        path = Path(run) / "recipe.yaml"
        recipe = (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
        parametrization = recipe.get("model", {}).get("parametrization", {})
        recipes.append({"lr": parametrization.get("lr"), "tau_ema": parametrization.get("tau_ema"),
                        "steps": recipe.get("trainer", {}).get("max_steps")})
    if len(tokens) > 1:
        raise ValueError(f"--framework runs are invalid together: their held-out losses are on {sorted(tokens)} tokens")
    if any(r != recipes[0] for r in recipes):
        raise ValueError(f"--framework runs are invalid together: their η, τ_EMA or steps differ ({recipes})")
    return {"runs": [Path(run).name for run in run_dirs], **recipes[0], "losses": losses,
            "heldout_loss": statistics.fmean(losses), "std": statistics.stdev(losses) if len(losses) > 1 else None,
            "heldout_tokens": tokens.pop()}


def check_like_for_like(framework: dict | None, settings: dict, modes: list) -> None:
    """The baselines' run length and τ_EMA must be the framework run's (its recipe.yaml, where it has one)."""
    if not framework:
        return
    if framework.get("steps") is not None and framework["steps"] != settings["steps"]:
        raise ValueError(f"--framework ran {framework['steps']} steps, the baselines {settings['steps']}: "
                         "not like for like (use its recipe.yaml as --config, and no --steps)")
    if FRAMEWORK in modes and framework.get("tau_ema") is not None and \
            not math.isclose(float(framework["tau_ema"]), settings["tau_ema"]):
        raise ValueError(f"--framework has τ_EMA {framework['tau_ema']}, --config {settings['tau_ema']}: the "
                         "baselines' framework weight decay would not be the framework's (use its recipe.yaml)")


def verdict(result: dict) -> str | None:
    framework = result.get("framework")
    bests = [(kind, result[kind]["best"]) for kind in NAMES if result[kind]["best"]]
    if not framework or not bests:
        return None
    if framework.get("heldout_tokens") != result.get("heldout_tokens"):
        return (f"not comparable: the framework's held-out loss is on {framework.get('heldout_tokens')} tokens, the "
                f"baselines' on {result.get('heldout_tokens')} (run its eval heldout with --max-tokens "
                f"{result.get('heldout_tokens')})")
    kind, top = min(bests, key=lambda item: item[1]["heldout_loss"])
    gap = framework["heldout_loss"] / top["heldout_loss"] - 1
    runs = len(framework.get("runs") or [1])
    line = (f"the framework's {mean_text(framework)} ({runs} run{'s' * (runs > 1)}) is {100 * gap:+.2f}% against the "
            f"better baseline's {mean_text(top)} ({NAMES[kind]}, η {top['lr']:g}, weight decay "
            f"{wd_text(top['weight_decay'])}, {len(top['seeds'])} seed{'s' * (len(top['seeds']) > 1)}): "
            f"{'within' if gap <= BAR else 'outside'} the {100 * BAR:.0f}% bar")
    edges = [f"{NAMES[k]}'s optimum η {b['lr']:g} is at its grid's edge" for k, b in bests if b["edge"]]
    return line + ("; " + "; ".join(edges) + " (extend the grid to bracket it)" if edges
                   else "; both baselines' optima are bracketed by their η grids")


def table(result: dict) -> str:
    """The BENCHMARKS.md table: held-out loss per η for each trainer and weight decay, best marked."""
    lrs = result["lrs_all"]
    lines = ["| trainer | weight decay | non-embedding params | " + " | ".join(f"η = {lr:g}" for lr in lrs)
             + " | best |", "|---|---|---|" + "---|" * len(lrs) + "---|"]
    for kind in NAMES:
        part = result[kind]
        for mode in dict.fromkeys(p["weight_decay"] for p in part["points"]):
            at = {p["lr"]: p for p in part["points"] if p["weight_decay"] == mode}
            top = best([r for r in part["rows"] if r["weight_decay"] == mode])
            ending = (f"{mean_text(top)} (η {top['lr']:g}, {len(top['seeds'])} seed{'s' * (len(top['seeds']) > 1)}"
                      f"{', edge' if top['edge'] else ''})") if top else "-"
            lines.append(f"| {LABELS[kind]} | {wd_text(mode)} | {part['non_embedding_params']:,} | "
                         + " | ".join(mean_text(at[lr]) if lr in at else "" for lr in lrs) + f" | {ending} |")
    framework = result.get("framework")
    if framework:
        runs = ", ".join(f"`{run}`" for run in framework.get("runs") or [framework.get("run")])
        lines.append(f"| layerdrop (tuned, {runs}) | framework | {result['plain']['non_embedding_params']:,} | "
                     + " | ".join("" for _ in lrs) + f" | {mean_text(framework)} (η {framework.get('lr')}) |")
    settings = result["settings"]
    lines += ["", f"Held-out loss on {result['heldout_tokens']:,} tokens after {settings['steps']:,} steps of "
              f"{settings['batch_size']} × {settings['seq_len']} tokens, the same batches for every row "
              f"(data.seed {settings['data_seed']}); mean ± sample std over seeds (they set the init) where a "
              f"point has more than one. Weight decay `framework`: decoupled AdamW λ = 1/(η·τ_EMA·steps) "
              f"(τ_EMA {settings['tau_ema']:g}: η·λ = {framework_lambda(1.0, settings):.3g}) on the blocks' "
              f"matrices only, as the framework; a number: that λ on every matrix, embedding and head included. "
              f"`{result['command']}`"]
    if result.get("partial"):
        lines += ["", "Partial: the grid is not finished (run the same command again to finish it)."]
    line = verdict(result)
    if line:
        lines += ["", f"Verdict: {line}."]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    epilog = __doc__[__doc__.index("Weight decay ("):__doc__.index("What differs")]  # the modes and seeds, as above
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="the recipe whose model, data order, schedule and τ_EMA the baselines copy "
                                         "(the framework run's recipe.yaml, or recipes/cpu-base.yaml)")
    parser.add_argument("--data", help="the prepared data folder the framework run trained on")
    parser.add_argument("--lrs", type=float, nargs="+", default=LRS,
                        help="η grid of the plain AdamW loop on our model (default √2 apart, 1.41e-3 … 1.13e-2)")
    parser.add_argument("--peer-lrs", type=float, nargs="+", default=LRS, help="η grid of the Llama peer (as --lrs)")
    parser.add_argument("--weight-decay", "--weight-decays", type=weight_decay_mode, nargs="+", default=[FRAMEWORK],
                        metavar="WD", help="one or more: 'framework' (the default: λ = 1/(η·τ_EMA·steps) on the "
                                           "blocks' matrices, as the framework) or a λ >= 0 on every matrix, "
                                           "embeddings included (the old baseline); every η is trained at each")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="init seeds of every grid point (default: the recipe's seed_everything)")
    parser.add_argument("--confirm-seeds", type=int, nargs="+", default=[],
                        help="seeds trained after the grid at each baseline's best (η, weight decay) only")
    parser.add_argument("--steps", type=int, default=None, help="override the recipe's max_steps (tiny checks)")
    parser.add_argument("--heldout-tokens", type=int, default=None, help="held-out tokens, spread over the val split "
                        "(default: the --framework runs' count, else 131072 as the sweeps' heldout)")
    parser.add_argument("--heldout-batch-size", type=int, default=16, help="as `eval heldout`'s default (16)")
    parser.add_argument("--framework", metavar="RUN_DIR", nargs="+", help="finished sweep runs of the framework at "
                        "this setting (seeds): the mean of their evals/heldout.json is the framework's row")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (of each job)")
    parser.add_argument("--jobs", type=int, default=1, help="points trained at a time, each in its own process")
    parser.add_argument("--out", default=str(RESULTS), help=f"the JSON (default {RESULTS})")
    parser.add_argument("--overwrite", action="store_true",
                        help="start the grid afresh even where --out holds rows of the same settings, or replace "
                             "this script's JSON of other settings (never a file it did not write)")
    parser.add_argument("--table", action="store_true", help="print the table of --out's JSON and exit")
    args = parser.parse_args(argv)
    if not args.table and not (args.config and args.data):
        parser.error("--config and --data are required (or --table to print the table of an earlier run)")
    for name in ("steps", "heldout_tokens", "heldout_batch_size", "threads", "jobs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')}={value} is invalid: must be >= 1")
    if any(lr <= 0 for lr in [*args.lrs, *args.peer_lrs]):
        parser.error("--lrs and --peer-lrs are invalid: every η must be > 0")
    for name in ("seeds", "confirm_seeds"):
        bad = [seed for seed in getattr(args, name) or [] if seed < 0]
        if bad:
            parser.error(f"--{name.replace('_', '-')}={bad[0]} is invalid: a seed must be >= 0")
    args.weight_decay = list(dict.fromkeys(args.weight_decay))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        framework = framework_result(args.framework)  # a bad folder fails before hours of training
        if args.table:
            return show_table(args, framework)
        settings = read_recipe(args.config)
        if args.steps:
            settings["steps"] = args.steps
        check_like_for_like(framework, settings, args.weight_decay)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.seeds = list(dict.fromkeys(args.seeds if args.seeds is not None else [settings["seed"]]))
    if args.heldout_tokens is None:
        args.heldout_tokens = framework["heldout_tokens"] if framework else 131072
    if args.threads:
        torch.set_num_threads(args.threads)
    ours_params = non_embedding(ours(settings))
    intermediate = matched_intermediate(settings, ours_params)
    peer_params = non_embedding(llama(settings, intermediate))
    print(f"ours: {ours_params:,} non-embedding parameters; Llama with intermediate_size {intermediate}: "
          f"{peer_params:,} ({100 * (peer_params / ours_params - 1):+.2f}%)", flush=True)
    record = json.loads(json.dumps({**{k: v for k, v in settings.items() if k != "seed"},  # seeds key the rows
                                    "config": args.config, "data": args.data, "heldout_tokens": args.heldout_tokens,
                                    "heldout_batch_size": args.heldout_batch_size}, default=str))
    out = Path(args.out)
    rows = earlier_rows(out, record, args.overwrite)
    command = shlex.join(["benchmarks/quality_bar.py", *(sys.argv[1:] if argv is None else argv)])

    def result_of(rows: dict[Key, dict]) -> dict:
        parts = {kind: [rows[key] for key in sorted((k for k in rows if k[0] == kind), key=lambda k: (
            str(k[2]), k[1], k[3]))] for kind in NAMES}
        measured = [r.get("heldout_tokens") for part in parts.values() for r in part if r.get("heldout_tokens")]
        result = {
            "settings": record,
            "heldout_tokens": measured[0] if measured else None,
            "lrs_all": sorted({key[1] for key in rows}),
            "plain": {"non_embedding_params": ours_params, "rows": parts["plain"], "points": points(parts["plain"]),
                      "best": best(parts["plain"])},
            "peer": {"model": "transformers.LlamaForCausalLM", "intermediate_size": intermediate,
                     "non_embedding_params": peer_params, "rows": parts["peer"], "points": points(parts["peer"]),
                     "best": best(parts["peer"])},
            "framework": framework,
            "partial": any(key not in rows for key in grid_tasks(args))
            or bool(confirm_tasks(rows, args.confirm_seeds)),
            "command": command,
        }
        result["verdict"] = verdict(result)
        return result

    out.parent.mkdir(parents=True, exist_ok=True)
    save = lambda rows: write_results(out, result_of(rows))  # noqa: E731
    tasks = [key for key in grid_tasks(args) if key not in rows]
    if len(tasks) < len(grid_tasks(args)):
        print(f"{len(grid_tasks(args)) - len(tasks)} points done earlier (in {args.out}), {len(tasks)} to train",
              flush=True)
    train_rows(tasks, settings, intermediate, args, rows, save)
    while tasks := confirm_tasks(rows, args.confirm_seeds):  # ends: each round adds rows to a finite grid
        print(f"confirming each best point: {len(tasks)} seed runs", flush=True)
        train_rows(tasks, settings, intermediate, args, rows, save)
    result = result_of(rows)
    write_results(out, result)
    print(table(result))
    print(f"wrote {args.out}")
    return 0


def show_table(args: argparse.Namespace, framework: dict | None) -> int:
    if not Path(args.out).is_file():
        print(f"error: --out {args.out!r} does not exist: run the grid first (--config, --data)", file=sys.stderr)
        return 2
    result = json.loads(Path(args.out).read_text())
    if not all("points" in result.get(kind, {}) for kind in NAMES):
        print(f"error: --out {args.out!r} is in the format before seeds and weight-decay modes: run the grid again "
              "(with --overwrite)", file=sys.stderr)
        return 2
    if framework:  # the framework's runs set beside baselines trained before they finished
        modes = {row["weight_decay"] for kind in NAMES for row in result[kind]["rows"]}
        check_like_for_like(framework, result["settings"], list(modes))
        result["framework"] = framework
        result["verdict"] = verdict(result)
        write_results(args.out, result)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
