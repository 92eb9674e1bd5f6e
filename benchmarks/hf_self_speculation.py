"""Self-speculation in transformers out of the box: what `export --format hf --draft-from`
gives a transformers user, against the same model without it and against layerdrop's own
`generate --mode speculative` on the same exit, the same prompts, in one process.

1. the draft: a `layerdrop speculate search` report of the checkpoint (``--search``; made
   here with a small budget when not given), whose ``best_exit`` is the measured fastest
   lossless exit draft;
2. `layerdrop export --format hf --draft-from REPORT` into a scratch folder;
3. transformers: ``model.generate(ids)`` (self-speculative: assistant_early_exit from the
   export's generation_config) vs ``generate(ids, assistant_early_exit=None)`` (plain greedy);
4. layerdrop: plain greedy vs the exit draft at the same exit and γ (eval/decoding/speedup.py).

Batch 1, every prompt of ``--prompts`` held-out sequences, ``--max-new-tokens`` new tokens each
(EOS not a stop, so both sides produce the same count), one untimed warm-up then ``--repeats``
timed runs, medians per prompt summed; tokens identical to plain greedy is checked on both
sides. Take it with nothing else running.

    .venv/bin/python benchmarks/hf_self_speculation.py --ckpt RUN/checkpoints/last.ckpt --data DATA
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from harness import RESULTS, environment, timed, write_results  # noqa: E402  (first: the repository's packages)


def hf_side(folder: Path, prompts: list[list[int]], new_tokens: int, repeats: int) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    sides = {"plain": {"assistant_early_exit": None}, "self_speculative": {}}
    seconds = {name: 0.0 for name in sides}
    outputs: dict[str, list[list[int]]] = {name: [] for name in sides}
    for prompt in prompts:
        ids = torch.tensor([prompt])
        for name, extra in sides.items():
            def run(extra=extra):
                with torch.no_grad():
                    return model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **extra)
            run()  # warm-up
            times = []
            for _ in range(repeats):
                out, wall, _ = timed(run)
                times.append(wall)
            seconds[name] += statistics.median(times)
            outputs[name].append(out[0, len(prompt):].tolist())
    tokens = new_tokens * len(prompts)
    return {"plain_tokens_per_s": tokens / seconds["plain"],
            "self_speculative_tokens_per_s": tokens / seconds["self_speculative"],
            "speedup": seconds["plain"] / seconds["self_speculative"],
            "identical_to_greedy": outputs["self_speculative"] == outputs["plain"],
            "exit": model.generation_config.assistant_early_exit,
            "num_assistant_tokens": model.generation_config.num_assistant_tokens, "plain_outputs": outputs["plain"]}


def layerdrop_side(ckpt: str, prompts: list[list[int]], exit_layer: int, gamma: int, new_tokens: int,
                   repeats: int) -> dict:
    """Plain greedy vs the exit draft in layerdrop's decoder (eval/decoding/speedup.py's report)."""
    from eval.decoding.drafts import ExitDraft
    from eval.decoding.speedup import compare
    from framework.checkpoint import load_decoder

    model, _ = load_decoder(ckpt)
    return compare(model, ExitDraft(exit_layer), prompts, max_new_tokens=new_tokens, gamma=gamma,
                   repeats=repeats, eos_id=None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True, help="a layerdrop checkpoint of a family with a transformers class")
    parser.add_argument("--data", required=True, help="the prepared folder its prompts come from (validation split)")
    parser.add_argument("--label", default=None, help="what the JSON calls the model (default: the checkpoint's "
                                                       "file name; no machine path is written)")
    parser.add_argument("--search", default=None, help="a `speculate search` report of --ckpt (default: made here)")
    parser.add_argument("--search-budget", type=int, default=20, help="objective evaluations per method of the "
                                                                     "search made here (default 20)")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS / "hf_self_speculation.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from eval.decoding.draft_search import main as search_main
    from eval.inputs import validation_prompts
    from framework.checkpoint.export import main as export_main
    from framework.files.nesting import json_document

    with tempfile.TemporaryDirectory() as scratch:
        search = Path(args.search) if args.search else Path(scratch) / "search.json"
        if args.search is None:
            assert search_main(["--ckpt", args.ckpt, "--data", args.data, "--budget", str(args.search_budget),
                                "--confirm-exits", "3",
                                "--threads", str(args.threads), "--out", str(search)]) == 0
        report = json_document(search.read_text(), str(search))
        folder = Path(scratch) / "hf"
        assert export_main(["--ckpt", args.ckpt, "--out", str(folder), "--format", "hf", "--draft-from",
                            str(search), "--no-tokenizer"]) == 0
        prompts = validation_prompts(args.data, count=args.prompts, length=args.prompt_len)
        hf = hf_side(folder, prompts, args.max_new_tokens, args.repeats)
    ours = layerdrop_side(args.ckpt, prompts, report["best_exit"]["exit_layer"], report["gamma"],
                          args.max_new_tokens, args.repeats)
    same_model = hf.pop("plain_outputs") == [output["tokens"][-args.max_new_tokens:] for output in ours["outputs"]]
    result = {"model": args.label or Path(args.ckpt).name, "exit": report["best_exit"]["exit_layer"], "gamma": report["gamma"],
              "prompts": args.prompts, "prompt_len": args.prompt_len, "max_new_tokens": args.max_new_tokens,
              "repeats": args.repeats, "transformers": hf,
              "layerdrop": {"plain_tokens_per_s": ours["plain_tokens_per_s"], "spec_tokens_per_s": ours["tokens_per_s"],
                            **{key: ours[key] for key in ("speedup", "acceptance_rate", "identical_to_greedy")}},
              "search_best_exit": {k: v for k, v in report["best_exit"].items() if k not in ("measured", "outputs")},
              "same_greedy_tokens_both_sides": same_model, "environment": environment()}
    result["transformers_spec_vs_layerdrop_spec"] = (hf["self_speculative_tokens_per_s"]
                                                     / result["layerdrop"]["spec_tokens_per_s"])
    write_results(args.out, result)
    print("| side | plain greedy tokens/s | self-speculative tokens/s | speedup | lossless |")
    print("|---|---:|---:|---:|---|")
    print(f"| transformers generate (exit {hf['exit']}, {hf['num_assistant_tokens']} a round) | "
          f"{hf['plain_tokens_per_s']:,.0f} | {hf['self_speculative_tokens_per_s']:,.0f} | {hf['speedup']:.2f}x | "
          f"{hf['identical_to_greedy']} |")
    ld = result["layerdrop"]
    print(f"| layerdrop generate --mode speculative (exit {result['exit']}) | {ld['plain_tokens_per_s']:,.0f} | "
          f"{ld['spec_tokens_per_s']:,.0f} | {ld['speedup']:.2f}x | {ld['identical_to_greedy']} |")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
