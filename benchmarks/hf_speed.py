"""Ours vs transformers on the same tiny model, CPU: training step and decoding speed.

A random ``LlamaForCausalLM`` (d = 256, L = 6, 4 query / 2 key-value heads, SwiGLU 688,
vocabulary 2048, tied embeddings) is saved with ``save_pretrained`` and loaded by
layerdrop from that folder (``load_decoder``): the same weights on both sides, fp32.
``--family qwen2`` / ``qwen3`` takes ``Qwen2ForCausalLM`` (q/k/v biases) /
``Qwen3ForCausalLM`` (per-head q/k norms, head_dim 64) of the same shape instead.

- forward+backward of a batch of 8 × 128 tokens with the cross-entropy loss: ours dense,
  ours with layer dropout (ILD, p_max 0.4, constant: P̄ = 0.2 of block FLOPs skipped),
  and transformers' (SDPA attention);
- greedy ``generate`` tokens/s at batch 1 and batch 8 (the same prompts, EOS ignored,
  64 new tokens): ours (eval/decoding's BatchGenerator, the `layerdrop generate` path) vs
  transformers' ``generate``.

Repetitions are interleaved (every case once, then again), medians kept; wall and
process (CPU) time both recorded. Ratios are transformers' time ÷ ours (> 1: ours is
faster), all from this one run. Take them on an idle machine (ENVIRONMENT.md).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/hf_speed.py [--family qwen2]
    .venv/bin/python benchmarks/hf_speed.py --repeats 1 --max-new-tokens 4 --steps 1   # a smoke test
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from harness import RESULTS, timed, write_results  # noqa: E402  (first: the repository's packages)
from eval.decoding.batch import BatchGenerator  # noqa: E402
from framework.checkpoint import load_decoder  # noqa: E402
from framework.config import LayerDropoutConfig  # noqa: E402
from framework.layer_dropout import StepKey, plan  # noqa: E402
from framework.schedules import dropout_rates  # noqa: E402

VOCAB, BATCH, SEQ = 2048, 8, 128


FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM", {}),
            "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"use_sliding_window": False}),
            "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"use_sliding_window": False, "head_dim": 64})}


def tiny_model(folder: Path, family: str):
    import transformers

    config_class, model_class, own = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=None, pad_token_id=None, **own)
    model = getattr(transformers, model_class)(config).eval()  # transformers' default attention on CPU: SDPA
    model.save_pretrained(folder)
    return model


def training_cases(hf, ours, tokens: torch.Tensor, steps: int) -> dict:
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    cfg = LayerDropoutConfig(p_max=0.4, distribution="increasing", schedule="constant")
    rates = dropout_rates(cfg, len(ours.blocks), 0, 1)

    def ours_step(dropout: bool):
        def run():
            for step in range(steps):
                drop = plan(cfg, rates, inputs.shape[0], StepKey(0, 0, step)) if dropout else None
                logits = ours(inputs, plan=drop)
                F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)).backward()
        return run

    def hf_step():
        for _ in range(steps):
            hf(input_ids=inputs, labels=tokens[:, :-1].clone()).loss.backward()  # HF shifts the labels itself

    return {"ours dense": ours_step(False), "ours ILD p_max 0.4": ours_step(True), "transformers": hf_step}


def generate_cases(hf, ours, prompts: list[list[int]], new_tokens: int) -> dict:
    cases = {}
    for batch in (1, 8):
        chunk = prompts[:batch]

        def ours_run(chunk=chunk):
            BatchGenerator(ours).generate(chunk, new_tokens)

        def hf_run(chunk=chunk):
            ids = torch.tensor(chunk)  # equal-length prompts: no padding on either side
            hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                        min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)

        cases[f"ours batch {batch}"] = ours_run
        cases[f"transformers batch {batch}"] = hf_run
    return cases


def measure(cases: dict, repeats: int) -> dict:
    times = {name: [] for name in cases}
    for _ in range(repeats):  # interleaved: every case once, then again
        for name, run in cases.items():
            times[name].append(timed(run)[1:])
    return {name: {"wall_s": statistics.median(w for w, _ in runs), "cpu_s": statistics.median(c for _, c in runs),
                   "repeats": len(runs)} for name, runs in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3, help="training steps per repetition")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--family", choices=list(FAMILIES), default="llama")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/hf_speed.json (llama), "
                                                    "hf_speed_<family>.json (the others)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()  # the ratios are only as good as the machine is quiet
    suffix = "" if args.family == "llama" else f"_{args.family}"
    args.out = args.out or str(RESULTS / f"hf_speed{suffix}.json")
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        hf = tiny_model(Path(tmp) / args.family, args.family)
        ours, _ = load_decoder(Path(tmp) / args.family)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))
    prompts = torch.randint(0, VOCAB, (8, 16), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():  # the same function first: a speed ratio of two different models means nothing
        assert (ours(tokens[:, :16]) - hf(tokens[:, :16]).logits).abs().max() <= 1e-4
    ours.train(), hf.train()
    training = measure(training_cases(hf, ours, tokens, args.steps), args.repeats)
    ours.eval(), hf.eval()
    decoding = measure(generate_cases(hf, ours, prompts, args.max_new_tokens), args.repeats)
    hf_train = training["transformers"]["wall_s"]
    ratios = {"train ours dense": hf_train / training["ours dense"]["wall_s"],
              "train ours ILD p_max 0.4": hf_train / training["ours ILD p_max 0.4"]["wall_s"]}
    for batch in (1, 8):
        ratios[f"generate batch {batch}"] = (decoding[f"transformers batch {batch}"]["wall_s"]
                                             / decoding[f"ours batch {batch}"]["wall_s"])
    tokens_per_s = {name: batch * args.max_new_tokens / row["wall_s"] for name, row in decoding.items()
                    for batch in [int(name.rsplit(" ", 1)[1])]}
    import transformers

    result = {"family": args.family, "machine": platform.processor() or platform.machine(),
              "threads": torch.get_num_threads(), "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
              "torch": torch.__version__, "transformers": transformers.__version__, "repeats": args.repeats,
              "transformers_attention": hf.config._attn_implementation,
              "training_step": {"batch": BATCH, "seq_len": SEQ, "steps_per_repeat": args.steps, **training},
              "generate": {"new_tokens": args.max_new_tokens, "prompt_len": 16, **decoding,
                           "tokens_per_s": tokens_per_s},
              "ratio_transformers_over_ours": ratios}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, result)
    print("| case | transformers ÷ ours (wall) |\n|---|---|")
    for name, ratio in ratios.items():
        print(f"| {name} | {ratio:.2f}× |")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
