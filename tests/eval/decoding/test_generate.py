"""`layerdrop generate`: text in every mode, stop strings, EOS, files, and bad input.

The model is the random tiny decoder of the lm-eval tests with its BPE tokenizer
beside it (tests/eval/tiny_lm.py); exit adapters for it are random too (the modes only
need their shapes).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from eval.adapters.exit_adapters import ExitAdapters, save_adapters
from eval.decoding import modes
from eval.decoding.generate import Streamer, main
from eval.decoding.batch import BatchGenerator
from eval.decoding.static_route import StaticRoute
from framework.tokenizer import TextCodec
from framework.checkpoint import Checkpoint, load_decoder
from tests.helpers.hostile_files import deep_json
from tests.helpers.in_process import run_main
from tiny_lm import export_tiny_model

PROMPT = "The sun rises in the"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = export_tiny_model(tmp_path_factory.mktemp("generate") / "model", seed=5)
    backbone, _ = load_decoder(folder)
    adapters = ExitAdapters(backbone.config, [1, 2])
    adapters.initialise(backbone, "last")
    save_adapters(adapters, folder.parent / "adapters", {"backbone": str(folder), "model": backbone.config.to_dict()})
    return folder


@pytest.fixture(scope="module")
def reference(model_dir):
    """Full greedy decoding of PROMPT (the prompt starts a document: EOS first)."""
    model, _ = load_decoder(model_dir)
    codec = TextCodec.for_checkpoint(Checkpoint.open(model_dir))
    items, _ = BatchGenerator(model).generate([codec.encode_prompt(PROMPT)], 12, eos_id=codec.eos_id)
    return codec, items[0]


def run(argv, capsys, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    return run_main(main, argv, capsys)


@pytest.mark.parametrize("mode", ["full", "exit:2", "skip:1", "speculative", "dynamic", "exit:1+adapters",
                                  "dynamic+adapters", "speculative+adapters"])
def test_every_mode_prints_the_prompt_and_its_continuation(model_dir, reference, capsys, tmp_path, mode):
    codec, full = reference
    mode, _, with_adapters = mode.partition("+")
    extra = ["--adapters", model_dir.parent / "adapters"] if with_adapters else []
    stats = tmp_path / "stats.json"
    code, out = run(["--ckpt", model_dir, "--prompt", PROMPT, "--mode", mode, "--max-new-tokens", 12,
                     "--stats", stats, *extra], capsys)
    assert code == 0, out.err
    assert out.out.startswith(PROMPT) and out.out.endswith("\n")
    summary = json.loads(stats.read_text())
    assert summary["mode"] == mode and summary["tokens_per_s"] > 0 and f"[{mode}]" in out.err
    if mode in ("full", "speculative"):  # speculative greedy decoding is lossless
        assert out.out == PROMPT + codec.decode(full.tokens) + "\n"
        assert summary["new_tokens"] == len(full.tokens)
    if mode == "full":
        assert summary["layers_per_token"] == 3
    if mode == "speculative":
        assert 0 <= summary["acceptance_rate"] <= 1 and "acceptance" in out.err


@pytest.mark.parametrize("mode", ["speculative", "dynamic"])
def test_the_blocks_per_token_figure_names_what_it_counts_and_its_reference(model_dir, capsys, tmp_path, mode):
    """With an adapter draft the line read "6.98 of 6 layers per token": a share above 1. The
    figure counts blocks run (adapters', rejected drafts') against full decoding's L."""
    stats = tmp_path / "stats.json"
    code, out = run(["--ckpt", model_dir, "--prompt", PROMPT, "--mode", mode, "--max-new-tokens", 12,
                     "--adapters", model_dir.parent / "adapters", "--stats", stats], capsys)
    assert code == 0, out.err
    count = json.loads(stats.read_text())["layers_per_token"]
    assert f"{count:.2f} blocks run per token, adapter blocks included (full decoding: 3)" in out.err
    assert "of 3 layers" not in out.err


def test_threshold_zero_exits_at_the_first_candidate_and_one_is_full(model_dir, reference, capsys, tmp_path):
    codec, full = reference
    stats = tmp_path / "stats.json"
    code, out = run(["--ckpt", model_dir, "--prompt", PROMPT, "--mode", "dynamic", "--threshold", 1,
                     "--max-new-tokens", 12, "--stats", stats, "--no-echo"], capsys)
    assert code == 0 and out.out == codec.decode(full.tokens) + "\n"
    code, out = run(["--ckpt", model_dir, "--prompt", PROMPT, "--mode", "dynamic", "--threshold", 0, "--exits", "2",
                     "--max-new-tokens", 12, "--stats", stats, "--overwrite", "--ignore-eos"], capsys)
    assert code == 0 and json.loads(stats.read_text())["layers_per_token"] == 2


def test_a_stop_string_ends_the_text_before_it(model_dir, reference, capsys):
    codec, full = reference
    text = codec.decode(full.tokens)
    stop = text[3:5]
    code, out = run(["--ckpt", model_dir, "--prompt", PROMPT, "--stop", stop, "--max-new-tokens", 12, "--no-echo"],
                    capsys)
    assert code == 0 and out.out == text[:text.index(stop)] + "\n"


def test_generation_ends_at_eos(model_dir, capsys, tmp_path):
    """Name as EOS (--eot-token) a token the model writes after the prompt: the text
    ends before it. The prompt starts with that EOS too, so the reference does."""
    model, _ = load_decoder(model_dir)
    codec = TextCodec.for_checkpoint(Checkpoint.open(model_dir))
    for candidate in range(codec.tokenizer.get_vocab_size()):
        free, _ = BatchGenerator(model).generate([[candidate] + codec.encode(PROMPT)], 12)
        if candidate in free[0].tokens[1:]:
            break
    tokens = free[0].tokens
    cut = tokens.index(candidate)
    stats = tmp_path / "stats.json"
    code, out = run(["--ckpt", model_dir, "--prompt", PROMPT, "--eot-token", codec.tokenizer.id_to_token(candidate),
                     "--max-new-tokens", 12, "--no-echo", "--stats", stats], capsys)
    assert code == 0 and out.out == codec.decode(tokens[:cut]) + "\n"
    assert json.loads(stats.read_text())["new_tokens"] == cut < 12


def test_a_prompts_file_gives_jsonl_in_order(model_dir, capsys, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Snow is\n\nThe sun rises in the\nFish\n")
    code, out = run(["--ckpt", model_dir, "--prompts", prompts, "--batch-size", 2, "--max-new-tokens", 5,
                     "--temperature", 0.8, "--top-k", 20, "--seed", 1], capsys)
    assert code == 0, out.err
    rows = [json.loads(line) for line in out.out.splitlines()]
    assert [r["prompt"] for r in rows] == ["Snow is", "The sun rises in the", "Fish"]
    model, _ = load_decoder(model_dir)
    codec = TextCodec.for_checkpoint(Checkpoint.open(model_dir))
    for number, row in enumerate(rows):  # each row as its prompt decoded alone, with its own seed
        from eval.decoding.sampling import Sampling

        alone = BatchGenerator(model, StaticRoute(model), sampling=Sampling(0.8, 20), seed=1)
        items, _ = alone.generate([codec.encode_prompt(row["prompt"])], 5, eos_id=codec.eos_id, numbers=[number])
        assert row["tokens"] == items[0].tokens and row["text"] == codec.decode(items[0].tokens)
        assert row["finish_reason"] in ("eos", "length")


def test_a_sampled_prompt_gives_the_same_text_alone_and_in_a_file(model_dir, capsys, tmp_path):
    prompts = tmp_path / "two.txt"
    prompts.write_text("def main(\nThe quick brown fox\n")
    sampled = ["--temperature", 1, "--seed", 5, "--max-new-tokens", 12, "--ignore-eos"]
    code, out = run(["--ckpt", model_dir, "--prompts", prompts, *sampled], capsys)
    assert code == 0, out.err
    in_file = [json.loads(line)["text"] for line in out.out.splitlines()][1]
    code, out = run(["--ckpt", model_dir, "--prompt", "The quick brown fox", "--no-echo", *sampled], capsys)
    assert code == 0 and out.out == in_file + "\n"
    code, out = run(["--ckpt", model_dir, "--prompt", "The quick brown fox", "--no-echo", "--seed-by", "position",
                     "--prompt", "The quick brown fox", *sampled], capsys)
    assert code == 0 and len(set(out.out.split("\n\n"))) == 2  # by position, repeated prompts differ


def test_stdin_is_the_prompt(model_dir, reference, capsys, monkeypatch):
    codec, full = reference
    code, out = run(["--ckpt", model_dir, "--max-new-tokens", 12], capsys, stdin=PROMPT, monkeypatch=monkeypatch)
    assert code == 0 and out.out == PROMPT + codec.decode(full.tokens) + "\n"


def test_stdin_loses_one_trailing_newline_as_echo_adds(model_dir, reference, capsys, monkeypatch):
    codec, full = reference
    code, out = run(["--ckpt", model_dir, "--max-new-tokens", 12, "--no-echo"], capsys, stdin=PROMPT + "\n",
                    monkeypatch=monkeypatch)
    assert code == 0 and out.out == codec.decode(full.tokens) + "\n"  # PROMPT's own continuation


def test_a_prompt_cut_for_max_new_tokens_says_what_it_kept(model_dir, capsys):
    code, out = run(["--ckpt", model_dir, "--prompt", "The sun rises in the east and sets in the west",
                     "--max-new-tokens", 62, "--no-echo", "--ignore-eos"], capsys)
    assert code == 0
    note = [line for line in out.err.splitlines() if line.startswith("note:")]
    assert note == ["note: 1 prompt(s) longer than the model's context (max_seq_len 64) less the 62 tokens to "
                    "generate (--max-new-tokens) kept only their last 2 tokens (the longest had "
                    f"{note[0].rsplit(' ', 1)[1]}"]


def test_several_prompts_print_in_order(model_dir, capsys):
    code, out = run(["--ckpt", model_dir, "--prompt", "Snow is", "--prompt", "Fish", "--max-new-tokens", 4], capsys)
    assert code == 0
    blocks = out.out.split("\n\n")
    assert blocks[0].startswith("Snow is") and blocks[1].startswith("Fish")


@pytest.mark.parametrize("args, message", [
    (["--prompt", ""], "prompt 1 is empty"),
    (["--prompt", "x", "--mode", "fast"], "--mode 'fast' is invalid: allowed: full, exit:K, skip:SET"),
    (["--prompt", "x", "--mode", "exit:0"], "--mode 'exit:0' is invalid: K must be in 1..3"),
    (["--prompt", "x", "--mode", "exit:4"], "--mode 'exit:4' is invalid: K must be in 1..3"),
    (["--prompt", "x", "--mode", "skip:3"], "layers [3] are outside 0..2"),
    (["--prompt", "x", "--mode", "dynamic", "--threshold", "1.5"], "threshold=1.5 is invalid: must be in [0, 1]"),
    (["--prompt", "x", "--mode", "dynamic", "--threshold", "-0.2"], "threshold=-0.2 is invalid"),
    (["--prompt", "x", "--mode", "speculative", "--draft", "exit:3"], "the draft's exit must be in 1..2"),
    (["--prompt", "x", "--mode", "speculative", "--draft", "adapter:1"], "needs --adapters DIR"),
    (["--prompt", "x", "--mode", "exit:2", "--draft", "exit:1"], "--draft is for --mode speculative"),
    (["--prompt", "x", "--gamma", "3"], "--gamma is for --mode speculative only (the mode given is 'full')"),
    (["--prompt", "x", "--adaptive"], "--adaptive is for --mode speculative only"),
    (["--prompt", "x", "--mode", "exit:2", "--threshold", "0.5"], "--threshold is for --mode dynamic only"),
    (["--prompt", "x", "--mode", "speculative", "--exits", "1"], "--exits is for --mode dynamic only"),
    (["--prompt", "x", "--mode", "skip:1", "--adapters", "ADAPTERS"],
     "--adapters is for --mode exit:K or speculative or dynamic only (the mode given is 'skip:1')"),
    (["--prompt", "x", "--adapters", "ADAPTERS"], "--adapters is for --mode exit:K or speculative or dynamic only"),
    (["--prompt", "x", "--mode", "dynamic", "--exits", "3"],
     "--exits '3' is invalid: candidate exits must be in 1..2 (exit K runs blocks 0..K-1; the model has 3 layers)"),
    (["--prompt", "x", "--mode", "dynamic", "--exits", "0,1"], "--exits '0,1' is invalid: candidate exits must be in 1..2"),
    (["--prompt", "x", "--mode", "dynamic", "--exits", "a"], "--exits 'a' is invalid: candidate exits must be in 1..2"),
    (["--prompt", "x", "--max-new-tokens", "64"], "--max-new-tokens=64 is invalid: must be below"),
    (["--prompt", "x", "--top-k", "5"], "give a temperature > 0"),
    (["--prompt", "x", "--batch-size", "0"], "--batch-size=0 is invalid"),
    (["--prompts", "/no/such/file.txt"], "--prompts '/no/such/file.txt' does not exist"),
    (["--prompts", "OBJECT"], "is invalid: it holds an object, expected a JSON list"),
    (["--prompts", "STRING"], "is invalid: it holds a string, expected a JSON list"),
    (["--prompt", "x", "--tokenizer", "GARBAGE"], "not a readable tokenizer.json"),
    (["--prompt", "x", "--eot-token", "<nope>"], "eot_token '<nope>' is not in the vocabulary of"),
])
def test_bad_input_is_one_line_before_the_model_loads(model_dir, capsys, tmp_path, monkeypatch, args, message):
    import framework.checkpoint

    if "--draft" not in args:  # the draft is checked against the loaded model's layers
        monkeypatch.setattr(framework.checkpoint.Checkpoint, "load_decoder", lambda *a, **k: pytest.fail("model loaded"))
    (tmp_path / "object.json").write_text('{"text": "a"}')
    (tmp_path / "string.json").write_text('"abc"')
    (tmp_path / "garbage.json").write_text("{not a tokenizer")
    files = {"ADAPTERS": model_dir.parent / "adapters", "OBJECT": tmp_path / "object.json",
             "STRING": tmp_path / "string.json", "GARBAGE": tmp_path / "garbage.json"}
    args = [str(files.get(a, a)) for a in args]
    code, out = run(["--ckpt", model_dir, *args], capsys)
    assert code == 2
    last = out.err.strip().splitlines()[-1]
    assert "error:" in last and message in last, out.err


def test_an_empty_prompts_file_names_the_flag_and_the_file(model_dir, capsys, tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    code, out = run(["--ckpt", model_dir, "--prompts", tmp_path / "empty.txt"], capsys)
    assert code == 2 and f"--prompts '{tmp_path / 'empty.txt'}' is empty" in out.err


def test_parse_mode():
    def parsed(spec):
        mode, value = modes.parse(spec, 4)
        return mode.name, value

    assert parsed("full") == ("full", None)
    assert parsed("exit:4") == ("exit", 4)
    assert parsed("skip:1-2") == ("skip", (1, 2))
    assert parsed("skip:alternate-odd") == ("skip", (1, 3))


def test_the_streamer_holds_back_a_possible_stop_string():
    class Codec:
        @staticmethod
        def decode(ids):
            return "".join(chr(i) for i in ids)

    out = io.StringIO()
    stream = Streamer(Codec(), ["END"], out)
    stream(0, [ord(c) for c in "abcE"])
    assert out.getvalue() == "abc"  # "E" may start "END"
    stream(0, [ord("x")])
    assert out.getvalue() == "abcEx"
    stream(0, [ord(c) for c in "EN"])
    assert out.getvalue() == "abcEx"
    stream.finish("abcEx")
    assert out.getvalue() == "abcEx\n"


def _hashes(folder) -> dict:
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", ["tokenizer-in-export", "speculate-run", "deep-json", "deep-jsonl"])
def test_hostile_prompt_and_tokenizer_files_are_one_line(model_dir, tmp_path, case):
    """A subprocess each, as a user runs it: exit 2, the error named, no traceback, nothing changed."""
    import os
    import shutil
    import subprocess
    import sys

    export = tmp_path / "export"
    shutil.copytree(model_dir, export)
    (tmp_path / "object.json").write_text('{"text": "a"}')
    (tmp_path / "string.json").write_text('"abc"')
    (tmp_path / "garbage.json").write_text("{not a tokenizer")
    (tmp_path / "ids.json").write_text("[[1, 2, 3]]")
    (tmp_path / "deep.json").write_text(deep_json(20_000))  # issue 46: a RecursionError traceback, rc 1
    (tmp_path / "deep.jsonl").write_text('{"text": "a"}\n{"text": ' + deep_json(3_000) + "}\n")
    command, message = {
        "object": (["generate", "--ckpt", export, "--prompts", tmp_path / "object.json"],
                   "it holds an object, expected a JSON list"),
        "string": (["generate", "--ckpt", export, "--prompts", tmp_path / "string.json"],
                   "it holds a string, expected a JSON list"),
        "tokenizer-flag": (["generate", "--ckpt", export, "--prompt", "x", "--tokenizer", tmp_path / "garbage.json"],
                           f"tokenizer '{tmp_path / 'garbage.json'}': not a readable tokenizer.json"),
        "tokenizer-in-export": (["generate", "--ckpt", export, "--prompt", "x"],
                                f"tokenizer '{export / 'tokenizer.json'}': not a readable tokenizer.json"),
        "speculate-run": (["speculate", "run", "--ckpt", export, "--prompts", tmp_path / "ids.json", "--out",
                           tmp_path / "report.json"], f"tokenizer '{export / 'tokenizer.json'}': not a readable"),
        "deep-json": (["generate", "--ckpt", export, "--prompts", tmp_path / "deep.json"],
                      f"error: --prompts '{tmp_path / 'deep.json'}' is refused: it is nested more than 100 levels"),
        "deep-jsonl": (["generate", "--ckpt", export, "--prompts", tmp_path / "deep.jsonl"],
                       f"error: --prompts '{tmp_path / 'deep.jsonl'}':2 is refused: it is nested more than 100"),
    }[case]
    if case in ("tokenizer-in-export", "speculate-run"):
        (export / "tokenizer.json").write_text("{not a tokenizer")
    before = _hashes(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, "-m", "framework.cli", *map(str, command)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert message in done.stderr.strip().splitlines()[-1]
    assert _hashes(tmp_path) == before


def test_a_window_of_10_to_the_12_tokens_is_accepted_and_what_it_would_allocate_is_checked(tmp_path, capsys):
    """Issue 46, decided: a Hugging Face folder's max_position_embeddings is the window the
    model claims; nothing is allocated by it, so 10^12 is accepted (a short prompt decodes).
    What is allocated from it, a KV cache of prompt + --max-new-tokens positions, is checked
    against free memory first: --max-new-tokens 10^9 was a 128 GB allocation's traceback."""
    from tests.helpers.hf_llama import tiny_hf_llama
    from tests.helpers.hf_tokenizer import llama3_tokenizer

    folder = tmp_path / "hf"
    tiny_hf_llama(folder, vocab=300, layers=2)
    llama3_tokenizer(folder / "tokenizer.json")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 10**12}))
    code, out = run(["--ckpt", folder, "--prompt", "hello", "--max-new-tokens", 5], capsys)
    assert code == 0, out.err
    code, out = run(["--ckpt", folder, "--prompt", "hello", "--max-new-tokens", 10**9], capsys)
    assert code == 2 and "Traceback" not in out.err
    line = out.err.strip().splitlines()[-1]
    assert line.startswith("error: the KV cache of 1 prompt(s) x 1,000,000,0") and "lower --max-new-tokens" in line


def test_the_help_says_how_a_prompt_starts_under_either_convention(capsys):
    """It said "the EOS token goes first" for every prompt, also for folders whose tokenizer adds a BOS."""
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "EOS token goes first" not in text
    assert "after an EOS" in text and "BOS where its post-processor adds one" in text and "eos_token_id list" in text
