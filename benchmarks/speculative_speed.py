"""Self-speculative decoding speed of a layer-dropout model against its dense twin.

The direction of the paper's Table 4: a model pretrained with layer dropout (ILD,
p_max = 0.4) should give its Draft & Verify draft a cheaper, still-accurate skip set
than the same recipe trained dense (p_max = 0), hence a higher speedup.

For each model:
1. search the draft's skip set with the four methods of eval/decoding/draft_search.py (same budget
   each; the estimate comes from teacher-forced passes over calibration prompts), and
   on small models also score every set (the exhaustive reference);
2. confirm each method's winner by real greedy decoding of other prompts, timed
   against plain greedy decoding in the same process (medians of several runs per
   prompt): speedup, acceptance α, T_draft/T_target, lossless or not;
3. estimate the LayerSkip-style early-exit draft at every exit layer E the same way
   and confirm the best E by real decoding;
4. count the evaluations each method needed to get within 5% of the best estimate.

The models are `layerdrop pretrain` checkpoints (--model NAME=PATH, repeatable). By
default: recipes/tiny.yaml with a constant schedule (ILD, p_max 0.4) and
recipes/tiny-dense.yaml, trained first with `layerdrop pretrain` when their
checkpoints are missing (minutes each; not part of the measurement).

    .venv/bin/python benchmarks/speculative_speed.py            # JSON -> benchmarks/results/
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from harness import REPO as ROOT, RESULTS, write_results  # noqa: E402  (first: the repository's packages)
from eval.inputs import validation_prompts  # noqa: E402
from eval.decoding.draft_objective import CalibrationObjective  # noqa: E402
from eval.decoding.draft_search import calibrate, search  # noqa: E402
from eval.decoding.skip_set_search import METHODS  # noqa: E402
from eval.decoding.drafts import ExitDraft, SkipDraft  # noqa: E402
from eval.decoding.speculative import AdaptiveThreshold  # noqa: E402
from eval.decoding.speedup import compare  # noqa: E402
from framework.checkpoint import load_decoder  # noqa: E402

OUT = ROOT / "benchmarks" / "out"
DEFAULT_DATA = OUT / "data"
# name -> (recipe, overrides, run folder): the ILD model is the paper's Table 4 row
# "0.4 (ILD)" (constant schedule); the dense twin differs in p_max only.
DEFAULT_MODELS = {
    "ild_p0.4": ("recipes/tiny.yaml", ["--model.layer_dropout.schedule", "constant"], OUT / "tiny-ild"),
    "dense": ("recipes/tiny-dense.yaml", [], OUT / "tiny-dense"),
}


def train_missing(name: str, data: Path) -> tuple[Path, float]:
    recipe, overrides, root = DEFAULT_MODELS[name]
    ckpt = root / "checkpoints" / "last.ckpt"
    if ckpt.exists():
        return ckpt, 0.0
    if not (data / "manifest.json").exists():
        print(f"preparing {data} (builtin corpus, 3M tokens) ...", flush=True)
        subprocess.run([sys.executable, "-m", "framework.cli", "prepare", "--corpus", "builtin", "--tokenizer",
                        "train", "--vocab-size", "8192", "--max-tokens", "3M", "--out", str(data),
                        "--no-progress"], check=True, cwd=ROOT)
    print(f"training {name}: layerdrop pretrain --config {recipe} {' '.join(overrides)} ...", flush=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "framework.cli", "pretrain", "--config", recipe, "--data.data_dir",
                    str(data), "--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar", "false",
                    *overrides], check=True, cwd=ROOT)
    return ckpt, time.perf_counter() - started


def exhaustive(objective: CalibrationObjective, num_layers: int) -> dict:
    """The estimate of every skip set that keeps at least one layer (small L only)."""
    best = (0.0, ())
    for bits in range(2 ** num_layers - 1):
        skip = tuple(i for i in range(num_layers) if bits >> i & 1)
        value = objective.estimate(skip)["speedup"]
        best = max(best, (value, skip))
    return {"skip_layers": list(best[1]), "estimated_speedup": best[0], "sets": 2 ** num_layers - 1}


SUMMARY_KEYS = ("speedup", "acceptance_rate", "draft_time_ratio", "identical_to_greedy", "tokens_per_round")


def run(model, draft, prompts, args, **options) -> dict:
    report = compare(model, draft, prompts, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                     seed=args.seed, **{"gamma": args.gamma, **options})
    return {k: report[k] for k in SUMMARY_KEYS}


def adaptive_options(args: argparse.Namespace) -> dict:
    return {"gamma": args.adaptive_gamma, "adaptive": AdaptiveThreshold(target=args.target_acceptance)}


def measure(ckpt: Path, args: argparse.Namespace) -> dict:
    model, cfg = load_decoder(ckpt)
    count = args.calibration_prompts + args.confirm_prompts
    prompts = validation_prompts(str(args.data), count=count, length=args.prompt_len)
    started = time.perf_counter()
    objective = calibrate(model, prompts[:args.calibration_prompts], gamma=args.gamma,
                          max_new_tokens=args.max_new_tokens)
    confirm = prompts[args.calibration_prompts:]
    report = search(model, objective, confirm, methods=METHODS, budget=args.budget,
                    max_new_tokens=args.max_new_tokens, repeats=args.repeats, seed=args.seed)
    reference = exhaustive(objective, cfg.n_layers) if cfg.n_layers <= 10 else None
    if reference:  # "within 5% of the best" against the true best estimate as well
        top = reference["estimated_speedup"]
        for r in report["methods"].values():
            r["evaluations_to_within_5pct_of_exhaustive"] = next(
                (i + 1 for i, v in enumerate(r["best_so_far"]) if v >= 0.95 * top), None)
    best = report["best"]
    skip = SkipDraft(best["skip_layers"])
    estimates = report["exit_draft_estimates"]
    exit_layer = int(max(estimates, key=lambda e: estimates[e]["speedup"]))
    return {
        "ckpt": str(ckpt), "num_layers": cfg.n_layers, "d_model": cfg.d_model,
        **{k: best[k] for k in SUMMARY_KEYS}, "skip_layers": best["skip_layers"], "best_method": best["method"],
        "tokens_per_s": best["tokens_per_s"], "plain_tokens_per_s": best["plain_tokens_per_s"],
        "search": report["methods"], "exhaustive": reference, "costs": report["costs"],
        "exit_draft": {"exit_layer": exit_layer, "estimated_speedup": estimates[str(exit_layer)]["speedup"],
                       **run(model, ExitDraft(exit_layer), confirm, args)},
        "exit_draft_estimates": estimates,
        # Draft & Verify's adaptive draft length (γ at most adaptive_gamma), same drafts.
        "adaptive_skip": run(model, skip, confirm, args, **adaptive_options(args)),
        "adaptive_exit": run(model, ExitDraft(exit_layer), confirm, args, **adaptive_options(args)),
        # Greedy continuations of small, briefly trained models fall into loops; sampling
        # (lossless in distribution) measures the same draft away from them.
        "sampling": run(model, skip, confirm, args, temperature=1.0),
        "seconds": time.perf_counter() - started,
    }


def _cell(r: dict) -> str:
    return f"{r['speedup']:.2f}× (α {r['acceptance_rate']:.0%})"


def table(results: dict) -> str:
    lines = ["| model | skip set (search) | speedup γ=5 | α | T_draft/T_target | lossless | exit draft γ=5 "
             "| adaptive γ: skip set | adaptive γ: exit | sampling T=1 | evals to 5% (BO / GA / HC / SA) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results["models"].items():
        evals = " / ".join(str(r["search"][m]["evaluations_to_within_5pct"]) for m in METHODS)
        ex = r["exit_draft"]
        lossless = all(x["identical_to_greedy"] for x in (r, ex, r["adaptive_skip"], r["adaptive_exit"]))
        lines.append(f"| {name} | {r['skip_layers']} | {r['speedup']:.2f}× | {r['acceptance_rate']:.0%} | "
                     f"{r['draft_time_ratio']:.2f} | {lossless} | E={ex['exit_layer']}: {_cell(ex)} | "
                     f"{_cell(r['adaptive_skip'])} | E={ex['exit_layer']}: {_cell(r['adaptive_exit'])} | "
                     f"{_cell(r['sampling'])} | {evals} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", default=None, metavar="NAME=CKPT",
                   help="a checkpoint to measure (repeatable; default: the ILD and dense tiny models)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="prepared folder for prompts (and training)")
    p.add_argument("--budget", type=int, default=24, help="objective evaluations per search method")
    p.add_argument("--gamma", type=int, default=5, help="draft length (5, as Table 4)")
    p.add_argument("--calibration-prompts", type=int, default=8)
    p.add_argument("--confirm-prompts", type=int, default=6)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--adaptive-gamma", type=int, default=10, help="the most draft tokens with adaptive drafting")
    p.add_argument("--target-acceptance", type=float, default=0.7, help="of the adaptive threshold")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per prompt (median)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "speculative_speed.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    models, trained = {}, {}
    for spec in args.model or list(DEFAULT_MODELS):
        if "=" in spec:
            name, path = spec.split("=", 1)
            models[name] = Path(path)
        else:
            models[spec], trained[spec] = train_missing(spec, args.data)
    started = time.perf_counter()
    results = {"benchmark": "speculative_speed", "threads": args.threads, "gamma": args.gamma,
               "adaptive_gamma": args.adaptive_gamma, "target_acceptance": args.target_acceptance,
               "budget_per_method": args.budget, "prompt_len": args.prompt_len,
               "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
               "torch": torch.__version__, "machine": platform.machine(), "training_seconds": trained,
               "models": {}}
    for name, ckpt in models.items():
        print(f"measuring {name} ({ckpt}) ...", flush=True)
        results["models"][name] = measure(ckpt, args)
    results["measure_seconds"] = time.perf_counter() - started
    results["table"] = table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, results)
    print(results["table"])
    print(f"wrote {args.out} ({results['measure_seconds']:.0f} s of measurement)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
