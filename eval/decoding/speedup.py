"""`layerdrop speculate run`: self-speculative decoding timed against plain decoding.

The algorithm is eval/decoding/speculative.py's; this is its timing harness and command. Both
decoders run the same prompts in the same process, interleaved, in batches of
``--batch-size`` (the paper's speedups are batch 1, the default), each timed as the
median of ``--repeats`` runs after a warm-up; the report's keys are fixed in DESIGN.md
and it also holds every continuation (token ids, and text for text prompts).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from framework.files.atomic_write import write_json
from eval import options
from eval.decoding.batch import BatchGenerator
from eval.decoding.compiled_step import CompiledStep
from eval.decoding.drafts import Draft, make_draft, searched_draft
from eval.decoding.sampling import Sampling
from eval.decoding.speculative import AdaptiveThreshold, SelfSpeculativeDecoder
from eval.decoding.static_route import StaticRoute
from eval.decoding.transcripts import GenerationStats
from framework.command_parser import CommandParser
from framework.model.decoder import Decoder


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class Comparison:
    """Plain vs self-speculative decoding of the same prompts, timed in one process."""

    plain_seconds: list[float] = field(default_factory=list)  # per batch, median of the repeats
    spec_seconds: list[float] = field(default_factory=list)
    plain: GenerationStats = field(default_factory=GenerationStats)
    spec: GenerationStats = field(default_factory=GenerationStats)
    identical: list[bool] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    tokens: int = 0


def compare(model: Decoder, draft: Draft, prompts: Sequence[torch.Tensor | Sequence[int]], *,
            max_new_tokens: int = 64, gamma: int = 5, adaptive: AdaptiveThreshold | None = None,
            temperature: float = 0.0, sampling: Sampling | None = None, repeats: int = 3, warmup: int = 1,
            seed: int = 0, batch_size: int = 1, eos_id: int | Sequence[int] | None = None,
            on_batch: Callable[[int], None] | None = None, compile: bool = False,
            static: bool | None = None) -> dict:
    """Time plain decoding and self-speculative decoding on every batch of prompts
    (median of ``repeats`` after ``warmup`` untimed runs each) and return the report.
    ``compile``: both decode through compiled steps (eval/decoding/compiled_step.py, with
    ``static`` shapes or not: None, static on a GPU), the compiling done in the warm-up runs
    (``warmup`` >= 1 then)."""
    if compile and warmup < 1:
        raise ValueError(f"warmup={warmup!r} is invalid with compile: the untimed warm-up run is where it compiles "
                         "(give warmup >= 1)")
    if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: must be an integer >= 1")
    if not prompts:
        raise ValueError("no prompts: give at least one")
    sampling = sampling or Sampling(temperature=temperature)
    rows = [torch.as_tensor(p).view(-1).tolist() for p in prompts]
    plain = BatchGenerator(model, StaticRoute(model), sampling=sampling, seed=seed)
    spec = SelfSpeculativeDecoder(model, draft, gamma=gamma, adaptive=adaptive, sampling=sampling, seed=seed)
    timing = dict(batch_size=batch_size, warmup=warmup, repeats=repeats, eos_id=eos_id, on_batch=on_batch)
    with CompiledStep.installed(model, static=static) if compile else nullcontext() as compiled:
        result = _time_batches(plain, spec, rows, max_new_tokens, **timing)
    report = _report(model, draft, spec, result, max_new_tokens=max_new_tokens, repeats=repeats,
                     batch_size=batch_size)
    report["compiled"] = compiled.summary() if compiled is not None else None
    return report


def _time_batches(plain: BatchGenerator, spec: SelfSpeculativeDecoder, rows: list[list[int]], max_new_tokens: int,
                  *, batch_size: int, warmup: int, repeats: int, eos_id, on_batch) -> Comparison:
    """Both decoders on every batch of ``rows``, interleaved: ``warmup`` untimed runs, then ``repeats`` timed."""
    result = Comparison()
    for start in range(0, len(rows), batch_size):
        numbers = list(range(start, min(start + batch_size, len(rows))))
        batch = [rows[i] for i in numbers]
        run = dict(eos_id=eos_id, numbers=numbers)
        for _ in range(warmup):
            plain.generate(batch, max_new_tokens, **run)
            spec.generate_batch(batch, max_new_tokens, **run)
        plain_runs, spec_runs = [], []
        for _ in range(repeats):
            reference, plain_stats = plain.generate(batch, max_new_tokens, **run)
            output, spec_stats = spec.generate_batch(batch, max_new_tokens, **run)
            plain_runs.append(plain_stats.seconds)
            spec_runs.append(spec_stats.seconds)
            result.plain.add(plain_stats)
            result.spec.add(spec_stats)
            result.identical.extend(a.tokens == b.tokens for a, b in zip(output, reference))
        result.plain_seconds.append(_median(plain_runs))
        result.spec_seconds.append(_median(spec_runs))
        result.outputs.extend(item.tokens for item in output)
        result.tokens += sum(len(item.tokens) for item in output)
        if on_batch is not None:
            on_batch(len(batch))
    return result


def _report(model: Decoder, draft: Draft, decoder: SelfSpeculativeDecoder, result: Comparison,
            *, max_new_tokens: int, repeats: int, batch_size: int) -> dict:
    spec, plain, greedy = result.spec, result.plain, decoder.sampling.greedy
    draft_forward = spec.draft_seconds / spec.draft_steps if spec.draft_steps else float("nan")
    target_forward = (plain.seconds - plain.prefill_seconds) / plain.steps if plain.steps else float("nan")
    plain_total, spec_total = sum(result.plain_seconds), sum(result.spec_seconds)
    per_batch = [p / s for p, s in zip(result.plain_seconds, result.spec_seconds)]
    return {
        **draft.describe(),
        "speedup": plain_total / spec_total,
        "speedup_median_over_batches": _median(per_batch),
        "acceptance_rate": spec.accepted / spec.drafted if spec.drafted else float("nan"),
        "draft_time_ratio": draft_forward / target_forward,
        # Sampling draws different tokens than greedy by design: identity does not apply.
        "identical_to_greedy": all(result.identical) if greedy else None,
        "mode": "greedy" if greedy else "sample",
        "temperature": decoder.sampling.temperature,
        "top_k": decoder.sampling.top_k,
        "top_p": decoder.sampling.top_p,
        "gamma": decoder.gamma,
        "adaptive": decoder.adaptive is not None,
        "final_threshold": decoder.adaptive.threshold if decoder.adaptive else None,
        "tokens_per_round": spec.new_tokens / spec.rounds if spec.rounds else float("nan"),
        "time_shares": spec.time_shares(),  # of the speculative runs' wall time, summed over batches and repeats
        "compactions": spec.compactions,  # batches' caches compacted (their holes' room ran out), summed likewise
        "tokens_per_s": result.tokens / spec_total,
        "plain_tokens_per_s": result.tokens / plain_total,
        "layers_per_token": spec.block_evaluations / spec.new_tokens if spec.new_tokens else float("nan"),
        "t_draft_ms": 1e3 * draft_forward,
        "t_target_ms": 1e3 * target_forward,
        "layers_run_by_draft": draft.layers_run(len(model.blocks)),
        "num_layers": len(model.blocks),
        "prompts": len(result.outputs),
        "batch_size": batch_size,
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "device": str(model.embed.weight.device),
        "outputs": [{"tokens": tokens} for tokens in result.outputs],
    }


# -------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="layerdrop speculate run",
                                description="Self-speculative decoding (Draft & Verify) timed against plain "
                                            f"decoding in the same process. Layer numbering: {options.LAYERS}.")
    options.add_checkpoint(p)
    draft = p.add_mutually_exclusive_group()
    draft.add_argument("--skip-layers", metavar="SET", help=f"the draft skips these blocks: {options.SKIP_HELP}")
    draft.add_argument("--exit-layer", type=int, metavar="E",
                       help="LayerSkip-style draft: early exit E, blocks 0..E-1 (E in 1..L-1); with --adapters, "
                            "through the adapter at E")
    draft.add_argument("--draft-from", metavar="SEARCH_REPORT",
                       help="the fastest lossless draft a `layerdrop speculate search` report measured (its best "
                            "skip set or its best exit, whichever decoded faster), at the report's γ")
    options.add_adapters(p, "the draft reads its exit through the adapter (default exit: the adapter exit "
                            "nearest L/3)")
    p.add_argument("--gamma", type=int, default=None,
                   help="draft tokens per round (the most, if --adaptive; default 5, or the report's with --draft-from)")
    p.add_argument("--adaptive", action="store_true",
                   help="stop drafting when the draft's top probability < a threshold adapted online")
    p.add_argument("--target-acceptance", type=float, default=None, help="with --adaptive (default 0.8)")
    p.add_argument("--threshold", type=float, default=None, help="initial threshold with --adaptive (default 0.5)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy, lossless (default); > 0 samples with the rejection step")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens (with --temperature)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass (with --temperature)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per batch, median kept (default 3)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts decoded together (default 1)")
    p.add_argument("--ignore-eos", action="store_true", help="generate --max-new-tokens even past EOS")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    options.add_prompt_arguments(p)
    options.add_device(p)
    options.add_threads(p)
    options.add_compile(p)
    options.add_output(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from eval.inputs import ContextLimit, check_vocabulary, load_prompts
    from framework.tokenizer import CodecLoader
    from framework.checkpoint import Checkpoint, CheckpointError
    from framework.console.loop_progress import progress

    parser = _parser()
    args = parser.parse_args(argv)
    options.check_positive(parser, args, ("gamma", "repeats", "num_prompts", "prompt_len", "max_new_tokens",
                                          "threads", "batch_size", "prompt_offset"), zero_ok=("prompt_offset",))
    options.refuse_existing(parser, [args.out], args.overwrite)
    options.check_checkpoint(parser, args.ckpt)
    device = options.resolve_device(parser, args.device)
    options.apply_threads(args.threads)
    try:
        sampling = Sampling(args.temperature, args.top_k, args.top_p)
        adaptive = _adaptive(args)
        ckpt = Checkpoint.open(args.ckpt)  # proven harmless and read once for the whole command
        codec = CodecLoader(ckpt, args.tokenizer, args.eot_token)
        prompts, texts = load_prompts(texts=args.prompt, prompts_file=args.prompts, data=args.data,
                                      count=args.num_prompts, length=args.prompt_len, codec=codec,
                                      offset=args.prompt_offset)
        cfg = ckpt.model_config
        spec, args.gamma = _draft_spec(args, cfg.n_layers)  # a bad --draft-from fails before the model loads
        check_vocabulary(prompts, cfg.vocab_size)
        args.max_new_tokens = options.max_new_tokens(args, cfg.max_seq_len)
        limit = ContextLimit(cfg.max_seq_len)
        prompts = [limit.fit(p, reserve=args.max_new_tokens) for p in prompts]
        eos_id = None if args.ignore_eos else codec.stop_ids_or_none()
        model, cfg = ckpt.load_decoder(device)
        adapters = _load_adapters(args.adapters, model)
        draft = make_draft(spec, cfg.n_layers, adapters)
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    limit.report()
    with progress(len(prompts), "speculate run: prompts") as bar:
        report = compare(model, draft, prompts, max_new_tokens=args.max_new_tokens, gamma=args.gamma,
                         adaptive=adaptive, sampling=sampling, repeats=args.repeats, seed=args.seed,
                         batch_size=args.batch_size, eos_id=eos_id, on_batch=bar.advance,
                         compile=args.compile is not None, static=options.compile_static(args.compile))
    for row, item in enumerate(report["outputs"]):
        item["prompt"] = texts[row] if texts is not None else prompts[row]
        if codec.loaded is not None:
            item["text"] = codec.loaded.decode(item["tokens"])
    report.update(label=options.checkpoint_label(args.ckpt), ckpt=str(args.ckpt), adapters=args.adapters,
                  draft_from=args.draft_from)
    write_json(args.out, report)
    print(f"{report['label']}: speedup {report['speedup']:.2f}x  acceptance {report['acceptance_rate']:.2%}  "
          f"T_draft/T_target {report['draft_time_ratio']:.2f}  identical_to_greedy {report['identical_to_greedy']}"
          f"  ({report['tokens_per_s']:.0f} vs {report['plain_tokens_per_s']:.0f} tokens/s); wrote {args.out}")
    print("speculative time: " + ", ".join(f"{name.replace('_', ' ')} {share:.0%}"
                                          for name, share in report["time_shares"].items()))
    if report["compiled"] is not None:
        print(f"compiled: {report['compiled']['graphs']} graphs in {report['compiled']['compile_seconds']:.1f} s "
              "(in the untimed warm-up)")
    return 0


def _draft_spec(args: argparse.Namespace, num_layers: int) -> tuple[str | None, int]:
    """(make_draft's spec, γ) from --skip-layers, --exit-layer or --draft-from."""
    if args.draft_from is not None:
        if args.adapters is not None:
            raise ValueError(f"--draft-from {args.draft_from!r} names a draft of the model's own layers: "
                             "it does not combine with --adapters")
        spec, gamma = searched_draft(args.draft_from, num_layers)
        return spec, gamma if args.gamma is None else args.gamma
    gamma = 5 if args.gamma is None else args.gamma
    if args.skip_layers is not None:
        return f"skip:{args.skip_layers}", gamma
    if args.exit_layer is not None:
        return f"{'adapter' if args.adapters is not None else 'exit'}:{args.exit_layer}", gamma
    return None, gamma


def _adaptive(args: argparse.Namespace) -> AdaptiveThreshold | None:
    given = [f"--{n.replace('_', '-')}" for n in ("target_acceptance", "threshold") if getattr(args, n) is not None]
    if not args.adaptive:
        if given:
            raise ValueError(f"{given[0]} is for --adaptive only (it sets the adaptive draft length)")
        return None
    target = 0.8 if args.target_acceptance is None else args.target_acceptance
    return AdaptiveThreshold(target, 0.5 if args.threshold is None else args.threshold)


def _load_adapters(path: str | None, model: Decoder):
    if path is None:
        return None
    from eval.adapters.exit_adapters import load_adapters

    return load_adapters(path, model)[0]


if __name__ == "__main__":
    sys.exit(main())
