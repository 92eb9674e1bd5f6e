"""Search the draft's skip set for the fastest lossless draft: `layerdrop speculate search`.

The paper (§8.2.2) searches which layers the Draft & Verify draft skips with Bayesian
optimisation (as Zhang et al. do), a genetic algorithm, hill climbing and simulated
annealing, and keeps the set with the highest speedup. Each method gets the same
budget of objective evaluations (distinct skip sets; a revisit is free).

The objective is cheap, no decoding:
- acceptance: the full model greedily continues some calibration prompts once; for a
  set S, ONE teacher-forced forward of the draft over those sequences (resumed from the
  full model's stream before S's first block) gives its next-token prediction at every
  position, and the rounds of greedy self-speculative decoding are replayed on that
  trajectory (draft min(γ, left) tokens, accept while the draft agrees, add one token
  from the verifier);
- cost: one draft forward costs c(S) = (t_0 + (L - |S|)/L · (t_L - t_0)) / t_L of a
  full one (t_0 the forward without blocks, t_L with all), a verify forward over m
  tokens v(m), m = 1..γ+1 (all measured once, before the search), or with
  ``--cost layers`` c = (L - |S|)/L and v = 1;
- estimated speedup = (N - 1) / Σ_rounds (k·c(S) + v(k + 1)), against the N - 1 steps of
  plain decoding after the shared prefill.

The draft in decoding reads the full model's K/V for past positions where the teacher-
forced pass uses its own, so the estimate is an estimate (exact for early-exit drafts,
whose layers are the full model's): the winners are confirmed by real decoding
(eval/decoding/speedup.py times it), which gives the measured speedup. The LayerSkip-style
early-exit draft is estimated the same way at every exit layer.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from framework.files.atomic_write import write_json
from eval import options
from eval.decoding.batch import BatchGenerator, left_padded
from eval.decoding.drafts import SkipDraft
from eval.decoding.speedup import compare
from framework.command_parser import CommandParser
from framework.model.decoder import Decoder

COSTS = ("measured", "layers")
Mask = tuple[bool, ...]  # mask[i] is True when the draft skips layer i


class BudgetExhausted(Exception):
    pass


def skip_set(mask: Mask) -> tuple[int, ...]:
    return tuple(i for i, skipped in enumerate(mask) if skipped)


class BudgetedObjective:
    """Counts distinct evaluations, refuses the one past the budget, keeps the history."""

    def __init__(self, fn: Callable[[Mask], float], budget: int, memo: dict | None = None,
                 on_step: Callable[[], None] | None = None) -> None:
        if not (isinstance(budget, int) and budget >= 1):
            raise ValueError(f"budget={budget!r} is invalid: must be an integer >= 1")
        self.fn, self.budget, self.on_step = fn, budget, on_step
        self.memo = {} if memo is None else memo  # may be shared: values, not the count
        self.seen: dict[Mask, float] = {}
        self.best_so_far: list[float] = []
        self.best: tuple[float, Mask] | None = None

    def __call__(self, mask: Mask) -> float:
        mask = tuple(bool(b) for b in mask)
        if mask in self.seen:
            return self.seen[mask]
        if len(self.seen) >= self.budget:
            raise BudgetExhausted
        if mask not in self.memo:
            self.memo[mask] = self.fn(mask)
        value = self.seen[mask] = self.memo[mask]
        if self.on_step is not None:
            self.on_step()
        if self.best is None or value > self.best[0]:
            self.best = (value, mask)
        self.best_so_far.append(self.best[0])
        return value

    @property
    def remaining(self) -> int:
        return self.budget - len(self.seen)


# ---------------------------------------------------------------------- methods
# Each runs until the budget is spent; a cap on proposals stops a method that only
# revisits sets it has seen (which cost nothing) from spinning forever.


def bayesian(objective: BudgetedObjective, num_layers: int, rng: random.Random) -> None:
    """Optuna's TPE sampler over one skip/keep choice per layer (ask/tell loop)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=rng.randrange(2**31), multivariate=True,
                                         n_startup_trials=max(2, min(10, objective.budget // 4)))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for _ in range(20 * objective.budget):
        if objective.remaining == 0:
            return
        trial = study.ask()
        mask = tuple(trial.suggest_categorical(f"skip_{i}", [False, True]) for i in range(num_layers))
        study.tell(trial, objective(mask))


def genetic(objective: BudgetedObjective, num_layers: int, rng: random.Random, *, population: int = 12,
            elite: int = 2, tournament: int = 3) -> None:
    """Elitist GA: tournament selection, uniform crossover, bit-flip mutation (1/L)."""
    size = max(4, min(population, objective.budget // 3))
    pop = [tuple(rng.random() < 0.5 for _ in range(num_layers)) for _ in range(size)]
    for _ in range(20 * objective.budget):
        scored = sorted(((objective(m), m) for m in pop), reverse=True)
        children = [m for _, m in scored[:elite]]
        while len(children) < size:
            a = max(rng.sample(scored, min(tournament, len(scored))))[1]
            b = max(rng.sample(scored, min(tournament, len(scored))))[1]
            child = tuple((x if rng.random() < 0.5 else y) != (rng.random() < 1.0 / num_layers)
                          for x, y in zip(a, b))
            children.append(child)
        pop = children


def _neighbours(mask: Mask, rng: random.Random) -> list[Mask]:
    out = [mask[:i] + (not mask[i],) + mask[i + 1:] for i in range(len(mask))]
    rng.shuffle(out)
    return out


def hill_climbing(objective: BudgetedObjective, num_layers: int, rng: random.Random) -> None:
    """First-improvement over single-layer flips from the full model (nothing skipped);
    a random restart at every local optimum."""
    current: Mask = (False,) * num_layers
    for _ in range(20 * objective.budget):
        value = objective(current)
        better = next((n for n in _neighbours(current, rng) if objective(n) > value), None)
        current = better or tuple(rng.random() < 0.5 for _ in range(num_layers))


def simulated_annealing(objective: BudgetedObjective, num_layers: int, rng: random.Random, *,
                        start_temperature: float = 0.1, end_temperature: float = 0.002) -> None:
    """Flip one random layer; accept worse sets with probability exp(Δ/T), T cooling
    geometrically over the budget (temperatures in speedup units)."""
    current: Mask = (False,) * num_layers
    value = objective(current)
    for _ in range(20 * objective.budget):
        progress = 1.0 - objective.remaining / objective.budget
        temperature = start_temperature * (end_temperature / start_temperature) ** progress
        i = rng.randrange(num_layers)
        candidate = current[:i] + (not current[i],) + current[i + 1:]
        new = objective(candidate)
        if new >= value or rng.random() < math.exp((new - value) / temperature):
            current, value = candidate, new


# The registry: a method's name -> its implementation, in the order reports list them.
SEARCHES: dict[str, Callable[[BudgetedObjective, int, random.Random], None]] = {
    "bayesian": bayesian, "genetic": genetic, "hill_climbing": hill_climbing,
    "simulated_annealing": simulated_annealing,
}
METHODS = tuple(SEARCHES)


def run_search(fn: Callable[[Mask], float], num_layers: int, *, methods: Sequence[str] | None = None,
               budget: int = 60, seed: int = 0, on_step: Callable[[], None] | None = None) -> dict[str, dict]:
    """Every method on ``fn`` with ``budget`` evaluations each; values are shared
    between methods (the objective is deterministic), the counts are not."""
    methods = METHODS if methods is None else methods
    unknown = [m for m in methods if m not in SEARCHES]
    if unknown or not methods:
        raise ValueError(f"methods={list(methods)} is invalid: allowed: {', '.join(METHODS)}")
    memo: dict[Mask, float] = {}
    results = {}
    for name in methods:
        objective = BudgetedObjective(fn, budget, memo, on_step)
        try:
            SEARCHES[name](objective, num_layers, random.Random(f"{seed}:{name}"))
        except BudgetExhausted:
            pass
        value, mask = objective.best
        results[name] = {"skip_layers": list(skip_set(mask)), "value": value,
                         "evaluations": len(objective.seen), "best_so_far": objective.best_so_far}
    top = max(r["value"] for r in results.values())
    for r in results.values():
        r["evaluations_to_within_5pct"] = next(
            (i + 1 for i, v in enumerate(r["best_so_far"]) if v >= 0.95 * top), None)
    return results


# -------------------------------------------------------------------- objective


@dataclass
class DraftCosts:
    """Forward times relative to one full single-token decoding step."""

    empty: float  # a forward that runs no block (embedding + head)
    verify: list[float]  # verify[m - 1]: a full forward over m tokens

    def draft(self, layers_run: int, num_layers: int) -> float:
        return self.empty + (1.0 - self.empty) * layers_run / num_layers

    @classmethod
    def from_layers(cls, gamma: int) -> "DraftCosts":
        return cls(empty=0.0, verify=[1.0] * (gamma + 1))

    @classmethod
    @torch.inference_mode()
    def measure(cls, model: Decoder, context: int, gamma: int, repeats: int = 15) -> "DraftCosts":
        """Forward times at ``context`` cached tokens, of the forwards a skip draft runs
        (its ``step`` with no block skipped, with every block skipped; its ``verify`` of
        m tokens): the fastest of ``repeats`` runs, interleaved, so that other processes'
        load disturbs every shape alike."""
        num_layers = len(model.blocks)
        full, empty = SkipDraft(()), SkipDraft(range(num_layers))
        cache = model.new_cache(1, context + gamma + 2)
        full.prefill(model, torch.zeros(1, context, dtype=torch.long), cache, None)
        shapes = [("verify", m) for m in range(1, gamma + 2)] + [("step", "full"), ("step", "empty")]

        def run(shape: tuple) -> None:
            kind, what = shape
            if kind == "verify":
                full.verify(model, torch.zeros(1, what, dtype=torch.long), cache, context)
            else:
                (full if what == "full" else empty).step(model, torch.zeros(1, 1, dtype=torch.long), cache)

        fastest = {shape: math.inf for shape in shapes}
        for repeat in range(repeats + 2):
            for shape in shapes:
                tick = time.perf_counter()
                run(shape)
                if repeat >= 2:  # the first runs warm up the allocator
                    fastest[shape] = min(fastest[shape], time.perf_counter() - tick)
                cache.crop(context)
        step = fastest[("step", "full")]
        return cls(empty=fastest[("step", "empty")] / step,
                   verify=[fastest[("verify", m)] / step for m in range(1, gamma + 2)])


def replay_rounds(agree: Sequence[bool], gamma: int) -> list[tuple[int, int]]:
    """(drafted, accepted) per round of greedy self-speculative decoding of a sequence
    whose token j the draft predicts right iff ``agree[j]`` (token 0 is the prefill's)."""
    rounds, produced, n = [], 1, len(agree)
    while produced < n:
        drafted = min(gamma, n - produced - 1)
        accepted = 0
        while accepted < drafted and agree[produced + accepted]:
            accepted += 1
        rounds.append((drafted, accepted))
        produced += accepted + 1
    return rounds


class CalibrationObjective:
    """Estimated speedup of a skip set from teacher-forced passes over calibration text.
    Prompts may differ in length: the sequences are left-padded, so every continuation
    ends at the right edge."""

    def __init__(self, model: Decoder, prompts: Sequence[torch.Tensor | Sequence[int]], *, new_tokens: int = 64,
                 gamma: int = 5, costs: DraftCosts | None = None) -> None:
        rows = [torch.as_tensor(p).view(-1).tolist() for p in prompts]
        self.model, self.gamma, self.new_tokens = model, gamma, new_tokens
        self.costs = costs or DraftCosts.from_layers(gamma)
        # The trajectory greedy decoding will follow: the full model's own continuation.
        items, _ = BatchGenerator(model).generate(rows, new_tokens)
        self.continuations = torch.tensor([item.tokens for item in items])
        self.sequences, self._padding = left_padded([r + item.tokens for r, item in zip(rows, items)], "cpu")
        self._prefix: list[torch.Tensor] | None = None
        self._inputs_padding: torch.Tensor | None = None
        self._estimates: dict[tuple, dict] = {}

    @torch.inference_mode()
    def agreement(self, skip: Sequence[int] = (), exit_layer: int | None = None) -> torch.Tensor:
        """[prompts, new_tokens] bool: the draft's teacher-forced prediction of each
        continuation token equals it (column 0 comes from the prefill, never drafted).
        The draft skips ``skip``, or exits after ``exit_layer`` (LayerSkip-style)."""
        num_layers = len(self.model.blocks)
        if self._prefix is None:
            # A draft equals the full model up to its first skipped block (or its exit):
            # keep the full model's stream before every block and resume from there.
            inputs, padding = self.sequences[:, :-1], self._padding[:, :-1]
            self._inputs_padding = padding if bool(padding.any()) else None
            embedded = self.model.step(inputs, layers=[]).hidden
            self._prefix = [embedded] + self.model.step(embedded, padding=self._inputs_padding, states=True).states
        if exit_layer is not None:
            self.model.active_layers(exit_layer)  # validates 1..L
            h = self._prefix[exit_layer]
        else:
            first = min(skip, default=num_layers)
            h = self.model.step(self._prefix[first], layers=[i for i in range(first, num_layers) if i not in skip],
                                padding=self._inputs_padding).hidden
        predictions = self.model.logits(h[:, -self.new_tokens:]).argmax(-1)
        return predictions == self.continuations

    def estimate(self, skip: Sequence[int] = (), exit_layer: int | None = None) -> dict:
        """Estimated speedup, acceptance and relative draft cost of one draft."""
        key = (tuple(sorted(set(skip))), exit_layer)
        if key not in self._estimates:
            self._estimates[key] = self._estimate(*key)
        return self._estimates[key]

    def _estimate(self, skip: Sequence[int], exit_layer: int | None) -> dict:
        num_layers = len(self.model.blocks)
        layers_run = exit_layer if exit_layer is not None else num_layers - len(set(skip))
        draft_cost = self.costs.draft(layers_run, num_layers)
        cost = drafted = accepted = 0.0
        steps = 0
        for row in self.agreement(skip, exit_layer).tolist():
            for k, a in replay_rounds(row, self.gamma):
                cost += k * draft_cost + self.costs.verify[k]
                drafted += k
                accepted += a
            steps += len(row) - 1
        return {"speedup": steps / cost if cost else 1.0, "acceptance": accepted / drafted if drafted else 1.0,
                "draft_cost": draft_cost}

    def __call__(self, mask: Mask) -> float:
        return self.estimate(skip_set(mask))["speedup"]


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
           seed: int = 0, on_step: Callable[[], None] | None = None) -> dict:
    """Every method on ``objective``, then each winner confirmed by decoding
    ``confirm_prompts``; the report's ``best`` is the fastest measured lossless set."""
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
    return {"num_layers": len(model.blocks), "gamma": objective.gamma, "budget": budget,
            "costs": {"empty": objective.costs.empty, "verify": objective.costs.verify},
            "search_seconds": search_seconds, "calibration_prompts": len(objective.sequences),
            "confirm_prompts": len(confirm_prompts), "methods": results,
            "exit_draft_estimates": exits,
            "best": {"method": winner, **confirmed[tuple(results[winner]["skip_layers"])]}}


def main(argv: list[str] | None = None) -> int:
    from eval.inputs import ContextLimit, check_vocabulary, load_prompts
    from framework.tokenizer import CodecLoader
    from framework.checkpoint import Checkpoint, CheckpointError
    from framework.training.loop_progress import progress

    parser = _parser()
    args = parser.parse_args(argv)
    options.check_positive(parser, args, ("budget", "gamma", "calibration_prompts", "confirm_prompts", "repeats",
                                          "prompt_len", "max_new_tokens", "threads"))
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
                                  length=args.prompt_len, codec=codec)
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
    with progress(len(methods) * args.budget + len(methods), "speculate search: evaluations + confirmations") as bar:
        objective = calibrate(model, prompts[:args.calibration_prompts], gamma=args.gamma, cost=args.cost,
                              max_new_tokens=args.max_new_tokens)
        report = search(model, objective, prompts[args.calibration_prompts:], methods=methods,
                        budget=args.budget, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                        seed=args.seed, on_step=bar.advance)
    report.update(cost_model=args.cost, ckpt=str(args.ckpt))
    write_json(args.out, report)
    for name, r in report["methods"].items():
        print(f"{name:>20}: skip {r['skip_layers']}  estimated {r['estimated_speedup']:.2f}x  measured "
              f"{r['measured_speedup']:.2f}x  ({r['evaluations']} evaluations)")
    print(f"best: {report['best']['method']} skip {report['best']['skip_layers']} "
          f"{report['best']['speedup']:.2f}x; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
