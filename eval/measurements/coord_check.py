"""The coordinate check of the paper's Fig. 2: `layerdrop eval coord-check`.

For several layer densities ρ (uniform, constant drop rate p = 1 - ρ) and for both
branch scales r_train ∈ {1, 1/ρ}, a small model is trained for a few steps from the
SAME initialisation on the SAME token stream, and the RMS of the final residual stream
(after the last block, before the final norm) is recorded at every step, in the
training forward that the drop plan shapes.

What to expect (paper §5, "Dropout Scale"): with r_train = 1 a sequence that passes
through fewer blocks collects fewer branch updates, so the stream's scale depends on ρ
and the curves separate as training aligns the branches; with r_train = 1/ρ the
expected residual update is the dense model's, the curves stay together, and
hyperparameters tuned at one density transfer to another. The report's "spread"
summarises it per r_train: (max - min) / mean of the RMS across densities, averaged
over the steps after the first.

The model uses the project's parametrization (µP + CompleteP, Table A.2) with a base
depth below the model's, so the CompleteP residual multiplier 1/m_L is active, as in
the paper's 40-layer check.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from framework.files.atomic_write import write_json
from eval import options
from framework.command_parser import CommandParser
from framework.config import LayerDropoutConfig, ModelConfig, ParametrizationConfig
from framework.layer_dropout import StepKey, plan
from framework.model.decoder import Decoder
from framework.training.parametrization import adamw, init_decoder_, model_multipliers
from framework.console.loop_progress import progress

R_TRAIN = ("one", "inverse_density")
DEFAULT_DENSITIES = (0.25, 0.5, 0.75, 1.0)


def markov_tokens(vocab_size: int, num_tokens: int, generator: torch.Generator, branching: int = 4) -> torch.Tensor:
    """A token stream from a random sparse first-order Markov chain: each token has
    ``branching`` likely successors, so there is structure to learn in a few steps."""
    successors = torch.randint(0, vocab_size, (vocab_size, branching), generator=generator)
    stream = torch.empty(num_tokens, dtype=torch.long)
    stream[0] = torch.randint(0, vocab_size, (1,), generator=generator)
    choices = torch.randint(0, branching, (num_tokens,), generator=generator)
    for t in range(1, num_tokens):
        stream[t] = successors[stream[t - 1], choices[t]]
    return stream


def training_batches(vocab_size: int, steps: int, batch_size: int, seq_len: int, seed: int) -> list[torch.Tensor]:
    """``steps`` batches [B, S+1] of the Markov stream (identical for every run)."""
    gen = torch.Generator().manual_seed(seed)
    stream = markov_tokens(vocab_size, steps * batch_size * (seq_len + 1), gen)
    return list(stream.view(steps, batch_size, seq_len + 1))


def rms(h: torch.Tensor) -> float:
    return float(h.detach().float().pow(2).mean().sqrt())


def train_and_record(initial: Decoder, pcfg: ParametrizationConfig, batches: Sequence[torch.Tensor],
                     density: float, r_train: str, seed: int, on_step: Callable[[], None] | None = None) -> list[float]:
    """RMS of the final residual stream at each training step of one run."""
    model = copy.deepcopy(initial).train()
    batch_size, seq_len = batches[0].shape[0], batches[0].shape[1] - 1
    tokens = batch_size * seq_len
    optimizer = adamw(model, pcfg, total_tokens=tokens * len(batches), batch_tokens=tokens)
    drop_cfg = LayerDropoutConfig(p_max=1.0 - density, distribution="uniform", schedule="constant",
                                  r_train=r_train, seed=seed)
    rates = [1.0 - density] * len(model.blocks)
    history = []
    for step, batch in enumerate(batches):
        drop_plan = plan(drop_cfg, rates, batch_size, StepKey(seed, 0, step))
        h = model.step(batch[:, :-1], plan=drop_plan).hidden
        history.append(rms(h))
        loss = F.cross_entropy(model.logits(h).flatten(0, 1).float(), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if on_step is not None:
            on_step()
    return history


def coord_check(*, densities: Sequence[float] = DEFAULT_DENSITIES, r_trains: Sequence[str] = R_TRAIN,
                steps: int = 10, d_model: int = 64, n_layers: int = 16, n_heads: int = 4,
                vocab_size: int = 256, batch_size: int = 32, seq_len: int = 32, lr: float = 1e-2,
                d_base: int | None = None, n_layers_base: int = 4, seed: int = 0,
                on_step: Callable[[], None] | None = None) -> dict:
    """Run every (r_train, density) pair from one initialisation; the report's series."""
    _validate(densities, r_trains, steps)
    pcfg = ParametrizationConfig(kind="complete_p", d_base=d_base or d_model, n_layers_base=n_layers_base, lr=lr)
    base_cfg = ModelConfig(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                           max_seq_len=seq_len, attention="sdpa")
    model_cfg = ModelConfig(**{**base_cfg.to_dict(), **model_multipliers(pcfg, base_cfg)})
    torch.manual_seed(seed)
    initial = init_decoder_(Decoder(model_cfg), pcfg, generator=torch.Generator().manual_seed(seed))
    batches = training_batches(vocab_size, steps, batch_size, seq_len, seed)
    series = []
    for r_train in r_trains:
        for density in densities:
            for step, value in enumerate(train_and_record(initial, pcfg, batches, density, r_train, seed, on_step)):
                series.append({"r_train": r_train, "density": density, "step": step, "rms": value})
    config = dict(densities=list(densities), r_train=list(r_trains), steps=steps, d_model=d_model,
                  n_layers=n_layers, n_heads=n_heads, vocab_size=vocab_size, batch_size=batch_size,
                  seq_len=seq_len, lr=lr, d_base=pcfg.d_base, n_layers_base=n_layers_base, seed=seed,
                  distribution="uniform", schedule="constant", measured="training forward, before the final norm")
    return {"series": series, "spread": spread(series), "config": config}


def spread(series: Sequence[dict]) -> dict[str, float]:
    """Per r_train: the relative spread (max - min) / mean of the RMS across densities,
    averaged over the training steps after the first (step 0 is the shared init, where
    only the branch scale differs)."""
    result = {}
    for r_train in sorted({s["r_train"] for s in series}):
        rows = [s for s in series if s["r_train"] == r_train]
        steps = sorted({s["step"] for s in rows if s["step"] > 0}) or [0]
        per_step = []
        for step in steps:
            values = [s["rms"] for s in rows if s["step"] == step]
            per_step.append((max(values) - min(values)) / (sum(values) / len(values)))
        result[r_train] = sum(per_step) / len(per_step)
    return result


def _validate(densities: Sequence[float], r_trains: Sequence[str], steps: int) -> None:
    for density in densities:
        if not 0.0 < density <= 1.0:
            raise ValueError(f"density={density!r} is invalid: must be in (0, 1]")
    for r_train in r_trains:
        if r_train not in R_TRAIN:
            raise ValueError(f"r_train={r_train!r} is invalid: allowed: {', '.join(R_TRAIN)}")
    if steps < 1:
        raise ValueError(f"steps={steps!r} is invalid: must be a positive integer")


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="layerdrop eval coord-check",
                                     description="The paper's coordinate check (Fig. 2): RMS of the final residual "
                                                 "stream per training step, for several layer densities and "
                                                 "r_train in {1, 1/ρ}.")
    parser.add_argument("--densities", type=float, nargs="+", default=list(DEFAULT_DENSITIES),
                        help="layer densities ρ = 1 - p (default: 0.25 0.5 0.75 1.0)")
    parser.add_argument("--r-train", nargs="+", choices=R_TRAIN, default=list(R_TRAIN), dest="r_trains")
    parser.add_argument("--steps", type=int, default=10, help="training steps per run (default 10, as the paper)")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--n-layers", type=int, default=16)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32,
                        help="sequences per step; many, so the per-sequence masks average out")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-2, help="base AdamW LR η (Table A.2 scales it)")
    parser.add_argument("--n-layers-base", type=int, default=4, help="CompleteP base depth L_base")
    parser.add_argument("--seed", type=int, default=0)
    options.add_output(parser, plot=True)
    args = parser.parse_args(argv)
    plot_path = args.plot or str(Path(args.out).with_suffix(".png"))
    options.refuse_existing(parser, [args.out, plot_path], args.overwrite)
    try:
        _validate(args.densities, args.r_trains, args.steps)
        with progress(len(args.densities) * len(args.r_trains) * args.steps, "coord-check: training steps") as bar:
            report = coord_check(densities=args.densities, r_trains=args.r_trains, steps=args.steps,
                                 d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                                 vocab_size=args.vocab_size, batch_size=args.batch_size, seq_len=args.seq_len,
                                 lr=args.lr, n_layers_base=args.n_layers_base, seed=args.seed, on_step=bar.advance)
    except ValueError as err:
        parser.error(str(err))
    report["plot"] = plot_path
    write_json(args.out, report)
    from eval.measurements.plots import plot_coord_check

    plot_coord_check(report, plot_path)
    for r_train, value in report["spread"].items():
        print(f"r_train={r_train}: RMS spread across densities {value:.3f} (mean over steps 1..)")
    print(f"wrote {args.out} and {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
