"""`layerdrop generate`: text in, text out, at the depth you choose.

    layerdrop generate --ckpt runs/demo/tiny/checkpoints/last.ckpt --prompt "def main("
    layerdrop generate --ckpt CKPT --prompt "def main(" --mode exit:3          # blocks 0..2 only
    layerdrop generate --ckpt CKPT --prompt "def main(" --mode skip:1,3        # blocks 1 and 3 skipped
    layerdrop generate --ckpt CKPT --prompt "def main(" --mode speculative     # full's text, drafted and verified
    layerdrop generate --ckpt CKPT --prompt "def main(" --mode dynamic --threshold 0.8
    layerdrop generate --ckpt CKPT --prompts prompts.jsonl --compile                 # compiled steps, same tokens
    layerdrop generate --ckpt CKPT --prompts prompts.jsonl --batch-size 16 --out out.jsonl

Modes (blocks are numbered 0..L-1; exit K runs blocks 0..K-1): see the list below
(eval/decoding/modes/ holds one module per mode).

A prompt starts a new document as training documents started: after an EOS for data
prepared with EOS between documents (`layerdrop prepare`'s own BPE), with the
tokenizer's BOS where its post-processor adds one (Llama 3; any Hugging Face folder's
own convention). Generation stops at any id that ends a text (the EOS, and every id of
an eos_token_id list), at any --stop string (cut from the text), or after --max-new-tokens. One prompt streams to the terminal as it is written; a prompts
file gives JSONL (to stdout, or --out). Statistics (tokens/s, layers per token, the
speculative acceptance rate) go to stderr, and to --stats as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

from framework.files.atomic_write import write_json, write_text
from eval import options
from framework.command_parser import CommandParser


def _parser() -> argparse.ArgumentParser:
    from eval.decoding import modes

    description = __doc__.split(":", 1)[1].strip() + "\n\nModes:\n" + modes.help_lines()
    p = CommandParser(prog="layerdrop generate", description=description,
                                epilog=f"Layer numbering: {options.LAYERS}.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_checkpoint(p)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prompt", action="append", default=None, metavar="TEXT",
                        help="a prompt (repeatable); without --prompt/--prompts, stdin is the prompt (less "
                             "one trailing newline)")
    source.add_argument("--prompts", metavar="FILE",
                        help="prompts: one a line, a .jsonl file with a \"text\" field, or a .json list "
                             "(- reads lines from stdin)")
    p.add_argument("--mode", default="full", metavar="MODE", help=f"one of: {modes.allowed()} (default full)")
    p.add_argument("--draft", default=None, metavar="SPEC",
                   help="speculative draft: exit:E, skip:SET or adapter:E (default: exit at E = round(L/3); with "
                        "--adapters the adapter exit nearest L/3)")
    p.add_argument("--gamma", type=int, default=None, help="speculative: draft tokens per round (default 5)")
    p.add_argument("--adaptive", action="store_true", help="speculative: stop drafting on low draft confidence")
    p.add_argument("--threshold", type=float, default=None,
                   help="dynamic: exit when top-1 minus top-2 probability >= this (in [0, 1]; default 0.9)")
    p.add_argument("--exits", default=None, metavar="K,K",
                   help="dynamic: candidate exits, each in 1..L-1 (default: ~L/4, L/2, 3L/4, or the adapters')")
    options.add_adapters(p, "exit:K and dynamic read their exits through them; speculative can draft with one")
    options.add_max_new_tokens(p)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="sample from the smallest set holding this mass")
    p.add_argument("--seed", type=int, default=0,
                   help="sampling seed: each prompt draws from its own stream, seeded from the seed and what "
                        "--seed-by says (the same seed gives the same text)")
    p.add_argument("--seed-by", choices=("prompt", "position"), default="prompt",
                   help="prompt (default): the seed and the prompt's tokens, so a prompt gives the same text alone, "
                        "in any batch and anywhere in a file (the same prompt twice: the same text twice); "
                        "position: the seed and the prompt's position in the input (0, 1, ...), so repeated "
                        "prompts give different texts")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when the text contains this (repeatable; cut from the output)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-text token")
    p.add_argument("--batch-size", type=int, default=8, help="prompts decoded together (default 8)")
    p.add_argument("--no-echo", action="store_true", help="print only the continuation, not the prompt first")
    options.add_tokenizer(p)
    options.add_device(p)
    options.add_threads(p)
    options.add_compile(p)
    options.add_output(p, required=False, what="write results as JSONL here (default: stdout)")
    p.add_argument("--stats", default=None, metavar="JSON", help="write the run's statistics here")
    return p


def _prompt_texts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list, bool]:
    """(prompts, from a file): text, or token-id lists from a .json file."""
    from eval.inputs import check_text_prompts, read_prompt_file

    if args.prompt is not None:
        check_text_prompts(args.prompt)
        return list(args.prompt), False
    if args.prompts is not None:
        rows = read_prompt_file(args.prompts)
        if rows and isinstance(rows[0], str):
            check_text_prompts(rows, f"--prompts {args.prompts!r}")
        return rows, True
    if sys.stdin.isatty():
        parser.error("no prompt: give --prompt TEXT, --prompts FILE, or text on stdin")
    text = sys.stdin.read()
    # `echo "def main(" | layerdrop generate` : the newline is echo's, not the prompt's (one, as a file line's)
    text = text[:-1] if text.endswith("\n") else text
    text = text[:-1] if text.endswith("\r") else text
    check_text_prompts([text], "stdin")
    return [text], False


def main(argv: list[str] | None = None) -> int:
    from eval.decoding import modes
    from eval.decoding.dynamic_exit import check_threshold, parse_candidates
    from eval.decoding.compiled_step import CompiledStep
    from eval.decoding.sampling import Sampling
    from eval.decoding.speculative import cache_positions
    from eval.inputs import ContextLimit, check_vocabulary
    from framework.tokenizer import TextCodec
    from framework.checkpoint import Checkpoint, CheckpointError

    parser = _parser()
    args = parser.parse_args(argv)
    options.check_positive(parser, args, ("gamma", "max_new_tokens", "batch_size", "threads"))
    options.refuse_existing(parser, [args.out, args.stats], args.overwrite)
    options.check_checkpoint(parser, args.ckpt)
    device = options.resolve_device(parser, args.device)
    options.apply_threads(args.threads)
    try:
        if args.threshold is not None:
            check_threshold(args.threshold)
        sampling = Sampling(args.temperature, args.top_k, args.top_p)
        rows, from_file = _prompt_texts(parser, args)
        ckpt = Checkpoint.open(args.ckpt)  # proven harmless and read once for the whole command
        codec = TextCodec.for_checkpoint(ckpt, args.tokenizer, args.eot_token)
        cfg = ckpt.model_config
        mode, value = modes.parse(args.mode, cfg.n_layers)
        modes.refuse_unread(mode, _settings(args, sampling, args.adapters), args.mode)
        if args.exits is not None:
            parse_candidates(args.exits, cfg.n_layers)  # the range now; adapters' exits once they load
        args.max_new_tokens = options.max_new_tokens(args, cfg.max_seq_len)
        prompts = [codec.encode_prompt(r) if isinstance(r, str) else list(r) for r in rows]
        check_vocabulary(prompts, cfg.vocab_size)
        limit = ContextLimit(cfg.max_seq_len)
        prompts = [limit.fit(p, reserve=args.max_new_tokens) for p in prompts]
        model, cfg = ckpt.load_decoder(device)
        # the longest prompt, the new tokens, and a speculative round's drafts and holes beyond them
        batch = min(args.batch_size, len(prompts))
        positions = cache_positions(max(map(len, prompts)), args.max_new_tokens, args.gamma or 5, batch)
        options.check_cache_fits(model, batch, positions, device)
        decode = mode.build(model, value, _settings(args, sampling, _adapters(args.adapters, model)))
        static = options.compile_static(args.compile)
        compiled = None if args.compile is None else CompiledStep.install(model, static=static)
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    limit.report()
    texts = [r if isinstance(r, str) else codec.decode(r) for r in rows]
    results, stats = _run(decode, prompts, texts, codec, args, stream=len(prompts) == 1 and not from_file
                          and args.out is None)
    _write(results, texts, args, from_file, codec)
    summary = {"mode": args.mode, "ckpt": str(args.ckpt), "num_layers": cfg.n_layers, "batch_size": args.batch_size,
               "device": str(device), **stats.summary()}
    if compiled is not None:  # its compile time is in the seconds above: a first run pays it
        summary["compiled"] = compiled.summary()
    line = (f"{summary['new_tokens']} tokens in {summary['seconds']:.2f} s: {summary['tokens_per_s']:.1f} tokens/s, "
            + blocks_per_token(summary["layers_per_token"], cfg.n_layers, adapters=args.adapters is not None))
    if "acceptance_rate" in summary:
        line += f", acceptance {summary['acceptance_rate']:.0%}"
    if compiled is not None:
        line += f"; compiled: {compiled.graphs} graphs in {compiled.compile_seconds:.1f} s (included)"
    print(f"[{args.mode}] {line}", file=sys.stderr)
    if args.stats:
        write_json(args.stats, summary)
    return 0


def blocks_per_token(count: float, num_layers: int, *, adapters: bool) -> str:
    """The cost line's figure. It counts every block that ran (an adapter block as one, a
    speculative draft's rejected tokens too), so it is not a share of the L layers: it
    can exceed L. Its reference is what full decoding runs per token."""
    counted = "blocks run per token, adapter blocks included" if adapters else "blocks run per token"
    return f"{count:.2f} {counted} (full decoding: {num_layers})"


def _settings(args: argparse.Namespace, sampling, adapters):
    """What the mode may read; ``adapters`` is the --adapters path before the model
    loads (only whether it was given matters then), the loaded adapters after."""
    from eval.decoding.modes import Settings

    return Settings(sampling=sampling, seed=args.seed, seed_by=args.seed_by, adapters=adapters, draft=args.draft, gamma=args.gamma,
                    adaptive=args.adaptive, threshold=args.threshold, exits=args.exits)


def _adapters(path: str | None, model):
    if path is None:
        return None
    from eval.adapters.exit_adapters import load_adapters

    return load_adapters(path, model)[0]


class Streamer:
    """Prints one sequence's text as it grows, holding back what could still turn into
    a stop string or an incomplete UTF-8 character."""

    def __init__(self, codec, stops: list[str], out=None) -> None:
        self.codec, self.stops, self.out = codec, [s for s in stops if s], out or sys.stdout
        self.tokens: list[int] = []
        self.shown = 0

    def __call__(self, number: int, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        text = self.codec.decode(self.tokens)
        safe = len(text.rstrip("\ufffd"))
        for stop in self.stops:
            if stop in text:
                safe = min(safe, text.index(stop))
            for size in range(len(stop) - 1, 0, -1):  # a stop string's beginning at the very end
                if text.endswith(stop[:size]):
                    safe = min(safe, len(text) - size)
                    break
        if safe > self.shown:
            self.out.write(text[self.shown:safe])
            self.out.flush()
            self.shown = safe

    def finish(self, final: str) -> None:
        if len(final) > self.shown:
            self.out.write(final[self.shown:])
        self.out.write("\n")
        self.out.flush()


def _run(decode, prompts, texts, codec, args, *, stream: bool):
    from eval.decoding.batch import generate_in_batches
    from eval.decoding.transcripts import StopStrings
    from framework.console.loop_progress import progress

    stop = StopStrings(args.stop, codec.decode)
    eos = None if args.ignore_eos else codec.stop_ids
    if stream:
        streamer = Streamer(codec, args.stop)
        if not args.no_echo:
            sys.stdout.write(texts[0])
            sys.stdout.flush()
        items, stats = decode(prompts, args.max_new_tokens, eos_id=eos, stop=stop, on_tokens=streamer)
        streamer.finish(stop.cut(codec.decode(items[0].tokens)))
        return items, stats
    with progress(len(prompts), "generate: prompts", enabled=len(prompts) > args.batch_size) as bar:
        return generate_in_batches(decode, prompts, args.batch_size, max_new_tokens=args.max_new_tokens, eos_id=eos,
                                   stop=stop, progress=bar.advance)


def _write(results, texts, args, from_file: bool, codec) -> None:
    from eval.decoding.transcripts import StopStrings

    stop = StopStrings(args.stop, codec.decode)
    if len(results) == 1 and not from_file and args.out is None:
        return  # streamed already
    rows = [{"prompt": prompt, "text": stop.cut(codec.decode(item.tokens)), "tokens": item.tokens,
             "finish_reason": item.finish_reason,
             "layers_per_token": sum(item.blocks) / len(item.blocks) if item.blocks else None}
            for prompt, item in zip(texts, results)]
    if args.out is not None:
        write_text(args.out, "".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} results to {args.out}", file=sys.stderr)
    elif from_file:
        sys.stdout.write("".join(json.dumps(r) + "\n" for r in rows))
    else:
        for number, row in enumerate(rows):
            separator = "\n" if number else ""
            sys.stdout.write(f"{separator}{'' if args.no_echo else row['prompt']}{row['text']}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
