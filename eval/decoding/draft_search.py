"""Search the draft's skip set for the fastest lossless draft: `layerdrop speculate search`.

The paper (§8.2.2) searches which layers the Draft & Verify draft skips with Bayesian
optimisation (as Zhang et al. do), a genetic algorithm, hill climbing and simulated
annealing, and keeps the set with the highest speedup. Each method gets the same
budget of objective evaluations (distinct skip sets; a revisit is free).

The objective is cheap, no decoding: the draft's acceptance replayed on teacher-forced
trajectories and a cost model of its forwards (eval/decoding/draft_objective.py); the
methods are eval/decoding/skip_set_search.py's.

The draft in decoding reads the full model's K/V for past positions where the teacher-
forced pass uses its own, so the estimate is an estimate (exact for early-exit drafts,
whose layers are the full model's): the winners are confirmed by real decoding
(eval/decoding/speedup.py times it), which gives the measured speedup. The LayerSkip-style
early-exit draft is estimated the same way at every exit layer.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Sequence

import torch

from framework.files.atomic_write import write_json
from eval import options
from eval.decoding.draft_objective import CalibrationObjective, DraftCosts
from eval.decoding.drafts import ExitDraft, SkipDraft
from eval.decoding.skip_set_search import METHODS, run_search
from eval.decoding.speedup import compare
from framework.command_parser import CommandParser
from framework.model.decoder import Decoder

COSTS = ("measured", "layers")


# -------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="layerdrop speculate search",
                                description="Search the skip set of the self-speculative draft (Bayesian "
                                            "optimisation, genetic, hill climbing, simulated annealing). "
                                            f"Layer numbering: {options.LAYERS}.")
    options.add_checkpoint(p)
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {', '.join(METHODS)}")
    p.add_argument("--budget", type=int, default=60, help="objective evaluations per method (default 60)")
    p.add_argument("--gamma", type=int, default=5, help="draft tokens per round (default 5, as Table 4)")
    p.add_argument("--cost", choices=COSTS, default="measured",
                   help="draft/verify cost: measured forward times (default) or layers kept")
    p.add_argument("--calibration-prompts", type=int, default=8,
                   help="prompts of the objective (default 8; any lengths)")
    p.add_argument("--confirm-prompts", type=int, default=4, help="prompts of the real decoding (default 4)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per confirm prompt (default 3)")
    p.add_argument("--confirm-exits", type=int, default=2,
                   help="exit drafts decoded for real, the best estimated first (default 2; the fastest is "
                        "the report's best_exit, what export --format hf --draft-from writes)")
    p.add_argument("--seed", type=int, default=0, help="seed of every search method")
    options.add_prompt_arguments(p, count=None)
    options.add_device(p)
    options.add_threads(p)
    options.add_output(p)
    return p


def calibrate(model: Decoder, prompts: Sequence[torch.Tensor], *, gamma: int = 5, cost: str = "measured",
              max_new_tokens: int = 64) -> CalibrationObjective:
    """The search objective on ``prompts``, with measured or layer-count costs."""
    if cost not in COSTS:
        raise ValueError(f"cost={cost!r} is invalid: allowed: {', '.join(COSTS)}")
    costs = (DraftCosts.measure(model, len(prompts[0]) + max_new_tokens // 2, gamma) if cost == "measured"
             else DraftCosts.from_layers(gamma))
    return CalibrationObjective(model, prompts, new_tokens=max_new_tokens, gamma=gamma, costs=costs)


def search(model: Decoder, objective: CalibrationObjective, confirm_prompts: Sequence[torch.Tensor], *,
           methods: Sequence[str] = METHODS, budget: int = 60, max_new_tokens: int = 64, repeats: int = 3,
           seed: int = 0, confirm_exits: int = 2, on_step: Callable[[], None] | None = None) -> dict:
    """Every method on ``objective``, then each winner confirmed by decoding
    ``confirm_prompts``; the report's ``best`` is the fastest measured lossless set, its
    ``best_exit`` the fastest of the ``confirm_exits`` best-estimated exit drafts."""
    if not confirm_prompts:
        raise ValueError("no prompts left to confirm the search with: give at least one")
    started = time.perf_counter()
    results = run_search(objective, len(model.blocks), methods=methods, budget=budget, seed=seed, on_step=on_step)
    search_seconds = time.perf_counter() - started
    confirmed: dict[tuple[int, ...], dict] = {}
    for r in results.values():
        key = tuple(r.pop("skip_layers"))
        if key not in confirmed:
            confirmed[key] = compare(model, SkipDraft(key), confirm_prompts, max_new_tokens=max_new_tokens,
                                     gamma=objective.gamma, repeats=repeats)
        if on_step is not None:
            on_step()
        estimate, run = objective.estimate(key), confirmed[key]
        del r["value"]
        r.update(skip_layers=list(key), estimated_speedup=estimate["speedup"],
                 estimated_acceptance=estimate["acceptance"], measured_speedup=run["speedup"],
                 acceptance_rate=run["acceptance_rate"], draft_time_ratio=run["draft_time_ratio"],
                 identical_to_greedy=run["identical_to_greedy"])
    lossless = {n: r for n, r in results.items() if r["identical_to_greedy"]} or results
    winner = max(lossless, key=lambda n: lossless[n]["measured_speedup"])
    exits = {str(e): objective.estimate(exit_layer=e) for e in range(1, len(model.blocks))}
    best_exit = _confirm_exits(model, exits, confirm_prompts, count=confirm_exits, gamma=objective.gamma,
                               max_new_tokens=max_new_tokens, repeats=repeats, on_step=on_step)
    return {"num_layers": len(model.blocks), "gamma": objective.gamma, "budget": budget,
            "costs": {"empty": objective.costs.empty, "verify": objective.costs.verify},
            "search_seconds": search_seconds, "calibration_prompts": len(objective.sequences),
            "confirm_prompts": len(confirm_prompts), "methods": results,
            "exit_draft_estimates": exits, "best_exit": best_exit,
            "best": {"method": winner, **confirmed[tuple(results[winner]["skip_layers"])]}}


def _confirm_exits(model: Decoder, estimates: dict[str, dict], prompts: Sequence[torch.Tensor], *, count: int,
                   gamma: int, max_new_tokens: int, repeats: int, on_step: Callable[[], None] | None) -> dict:
    """The ``count`` exit drafts of highest estimated speedup decoded for real; the fastest
    lossless one (what `export --format hf --draft-from` writes as ``assistant_early_exit``)."""
    ranked = sorted(estimates, key=lambda e: estimates[e]["speedup"], reverse=True)[:count]
    measured = {}
    for exit_layer in ranked:
        measured[exit_layer] = compare(model, ExitDraft(int(exit_layer)), prompts, max_new_tokens=max_new_tokens,
                                       gamma=gamma, repeats=repeats)
        if on_step is not None:
            on_step()
    lossless = [e for e in ranked if measured[e]["identical_to_greedy"]] or ranked
    best = max(lossless, key=lambda e: measured[e]["speedup"])
    return {"exit_layer": int(best), **measured[best],
            "measured": {e: {key: run[key] for key in ("speedup", "acceptance_rate", "identical_to_greedy")}
                         for e, run in measured.items()}}


def main(argv: list[str] | None = None) -> int:
    from eval.inputs import ContextLimit, check_vocabulary, load_prompts
    from framework.tokenizer import CodecLoader
    from framework.checkpoint import Checkpoint, CheckpointError
    from framework.console.loop_progress import progress

    parser = _parser()
    args = parser.parse_args(argv)
    options.check_positive(parser, args, ("budget", "gamma", "calibration_prompts", "confirm_prompts", "repeats", "confirm_exits",
                                          "prompt_len", "max_new_tokens", "threads", "prompt_offset"),
                           zero_ok=("prompt_offset",))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods or any(m not in METHODS for m in methods):
        parser.error(f"--methods {args.methods!r} is invalid: allowed: {', '.join(METHODS)}")
    options.refuse_existing(parser, [args.out], args.overwrite)
    options.check_checkpoint(parser, args.ckpt)
    device = options.resolve_device(parser, args.device)
    options.apply_threads(args.threads)
    count = args.calibration_prompts + args.confirm_prompts
    try:
        ckpt = Checkpoint.open(args.ckpt)  # proven harmless and read once for the whole command
        codec = CodecLoader(ckpt, args.tokenizer, args.eot_token)
        prompts, _ = load_prompts(texts=args.prompt, prompts_file=args.prompts, data=args.data, count=count,
                                  length=args.prompt_len, codec=codec, offset=args.prompt_offset)
        if len(prompts) < count:
            raise ValueError(f"{len(prompts)} prompts are too few: --calibration-prompts "
                             f"{args.calibration_prompts} + --confirm-prompts {args.confirm_prompts} need {count}")
        cfg = ckpt.model_config
        check_vocabulary(prompts, cfg.vocab_size)
        args.max_new_tokens = options.max_new_tokens(args, cfg.max_seq_len)
        limit = ContextLimit(cfg.max_seq_len)
        prompts = [limit.fit(p, reserve=args.max_new_tokens) for p in prompts]
        model, cfg = ckpt.load_decoder(device)
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    limit.report()
    confirm_exits = min(args.confirm_exits, cfg.n_layers - 1)
    with progress(len(methods) * args.budget + len(methods) + confirm_exits,
                  "speculate search: evaluations + confirmations") as bar:
        objective = calibrate(model, prompts[:args.calibration_prompts], gamma=args.gamma, cost=args.cost,
                              max_new_tokens=args.max_new_tokens)
        report = search(model, objective, prompts[args.calibration_prompts:], methods=methods,
                        budget=args.budget, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                        seed=args.seed, confirm_exits=confirm_exits, on_step=bar.advance)
    report.update(cost_model=args.cost, label=options.checkpoint_label(args.ckpt), ckpt=str(args.ckpt))
    write_json(args.out, report)
    for name, r in report["methods"].items():
        print(f"{name:>20}: skip {r['skip_layers']}  estimated {r['estimated_speedup']:.2f}x  measured "
              f"{r['measured_speedup']:.2f}x  ({r['evaluations']} evaluations)")
    exit_draft = report["best_exit"]
    print(f"{'exit draft':>20}: exit {exit_draft['exit_layer']}  measured {exit_draft['speedup']:.2f}x  "
          f"(the best of exits {', '.join(exit_draft['measured'])} by estimate)")
    print(f"{report['label']}: best: {report['best']['method']} skip {report['best']['skip_layers']} "
          f"{report['best']['speedup']:.2f}x; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
