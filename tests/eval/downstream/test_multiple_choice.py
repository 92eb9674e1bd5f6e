"""The native multiple-choice scorer, its metric and its validation callback.

(That it gives lm-eval's numbers on the same task is checked in
tests/eval/downstream/test_lm_eval_adapter.py, where lm-eval runs.)
"""

import json

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch.utils.data import DataLoader

from framework.config import ModelConfig
from framework.model.decoder import Decoder
from eval.downstream.multiple_choice import (Example, MultipleChoiceAccuracy, MultipleChoiceEval, choice_predictions,
                                             encode_pair, read_examples, score_continuations, score_examples,
                                             score_exits)

EXAMPLES = [
    {"context": "The sun rises in the", "choices": ["east", "west", "ocean"], "gold": 0},
    {"context": "Fish swim in the", "choices": ["water", "sky"], "gold": 0},
    {"context": "Snow is usually", "choices": ["white", "purple", "loud", "late"], "gold": 1},
    {"context": "", "choices": ["A tree has leaves.", "A tree has wheels."], "gold": 0},
    {"context": "Ice cream tastes  ", "choices": ["sweet", "salty"], "gold": 1},
]


@pytest.fixture(scope="module")
def tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([json.dumps(e) for e in EXAMPLES] * 3, trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def encoder(tok):
    return lambda text: tok.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def decoder():
    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=280, d_model=32, n_layers=3, n_heads=4, max_seq_len=48,
                                attention="sdpa", logit_multiplier=0.5))
    model.init_weights(std=0.2)
    return model.eval()


@pytest.fixture
def task_file(tmp_path):
    path = tmp_path / "task.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in EXAMPLES) + "\n\n")
    return path


def test_reads_examples_and_skips_blank_lines(task_file):
    examples = read_examples(task_file)
    assert len(examples) == 5 and examples[2] == Example("Snow is usually", ("white", "purple", "loud", "late"), 1)
    assert len(read_examples(task_file, limit=2)) == 2


@pytest.mark.parametrize("line, message", [
    ('{"context": "a", "choices": ["x", "y"], "gold": 2}', r":1: 'gold'=2 is invalid: must be an index in 0..1"),
    ('{"context": "a", "choices": ["x"], "gold": 0}', "at least 2 non-empty strings"),
    ('{"context": 3, "choices": ["x", "y"], "gold": 0}', "'context' must be a string"),
    ('{"context": "a", "choices": ["x", "y"], "gold": true}', "'gold'=True is invalid"),
    ("{not json", "not valid JSON"),
    ('{"context": "a", "choices": ' + "[" * 5_000 + "]" * 5_000 + "}", r"bad.jsonl:1 is refused: it is nested more"),
])
def test_malformed_lines_are_named(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        read_examples(path)


def test_missing_or_empty_task_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_examples(tmp_path / "none.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="holds no examples"):
        read_examples(tmp_path / "empty.jsonl")


def test_encode_pair_moves_trailing_spaces_and_prefixes_empty_contexts(tokenizer):
    encode = encoder(tokenizer)
    context_ids, continuation_ids = encode_pair(encode, "Ice cream tastes  ", "sweet", prefix_token_id=0)
    assert context_ids == encode("Ice cream tastes")
    assert context_ids + continuation_ids == encode("Ice cream tastes  sweet")
    assert encode_pair(encode, "", " A tree", prefix_token_id=0) == ([0], encode(" A tree"))


def reference(decoder, context, continuation, **forward):
    tokens = torch.tensor([context + continuation])
    with torch.no_grad():
        logprobs = F.log_softmax(decoder(tokens[:, :-1], **forward)[0].double(), dim=-1)
    picked = logprobs[-len(continuation):]
    target = torch.tensor(continuation)
    return float(picked.gather(-1, target[:, None]).sum()), bool((picked.argmax(-1) == target).all())


@pytest.mark.parametrize("forward", [{}, {"exit_layer": 2}, {"skip_layers": (1,)}])
@pytest.mark.parametrize("full_logits", [False, True])
def test_batched_scores_equal_one_forward_per_pair(decoder, forward, full_logits):
    gen = torch.Generator().manual_seed(3)
    pairs = [(torch.randint(1, 280, (n,), generator=gen).tolist(), torch.randint(1, 280, (m,), generator=gen).tolist())
             for n, m in [(5, 1), (1, 4), (12, 3), (7, 7), (2, 2)]]
    pairs.append(([7, 8, 9, 10], [1] * 2))  # a repeated token: greedy is plausible somewhere
    scores = score_continuations(decoder, pairs, batch_size=4, max_length=48, full_logits=full_logits, **forward)
    for pair, (value, greedy) in zip(pairs, scores):
        ref_value, ref_greedy = reference(decoder, *pair, **forward)
        assert value == pytest.approx(ref_value, abs=1e-4)
        assert greedy == ref_greedy


def test_shared_exits_and_adapter_exits_equal_each_alone(decoder):
    from eval.adapters.exit_adapters import ExitAdapters

    torch.manual_seed(5)
    adapters = ExitAdapters(decoder.config, [1, 2])
    adapters.initialise(decoder, "random")
    gen = torch.Generator().manual_seed(4)
    pairs = [(torch.randint(1, 280, (n,), generator=gen).tolist(), torch.randint(1, 280, (m,), generator=gen).tolist())
             for n, m in [(5, 1), (1, 4), (12, 3), (7, 7), (2, 2)]]
    found = score_exits(decoder, pairs, [1, 3], adapters={2: adapters.blocks["2"]}, batch_size=2, max_length=48)
    assert list(found) == [1, 3, ("adapter", 2)]
    alone = {1: score_continuations(decoder, pairs, batch_size=4, max_length=48, exit_layer=1),
             3: score_continuations(decoder, pairs, batch_size=4, max_length=48, exit_layer=3),
             ("adapter", 2): score_continuations(decoder, pairs, batch_size=4, max_length=48, exit_layer=2,
                                                 adapter=adapters.blocks["2"])}
    plain_two = score_continuations(decoder, pairs, batch_size=4, max_length=48, exit_layer=2)
    for key, values in alone.items():
        for (value, greedy), (ref_value, ref_greedy) in zip(found[key], values):
            assert value == pytest.approx(ref_value, abs=1e-5) and greedy == ref_greedy
    # the adapter column is the adapter's, not exit 2's plain head
    assert max(abs(a[0] - b[0]) for a, b in zip(found[("adapter", 2)], plain_two)) > 1e-3


def test_long_inputs_keep_their_last_tokens(decoder):
    context, continuation = list(range(1, 30)), [5, 6, 7]
    (value, _), = score_continuations(decoder, [(context, continuation)], batch_size=1, max_length=10)
    assert value == pytest.approx(reference(decoder, context[-8:], continuation)[0], abs=1e-4)
    with pytest.raises(ValueError, match="more than max_length=2"):
        score_continuations(decoder, [(context, continuation)], batch_size=1, max_length=2)
    with pytest.raises(ValueError, match="empty continuation"):
        score_continuations(decoder, [(context, [])], batch_size=1, max_length=10)


def test_predictions_normalise_by_characters_and_by_bytes():
    # -1 per character for all three (a tie: the first wins), but "éé" has 4 UTF-8
    # bytes, so per byte it is the best; unnormalised, a short choice wins.
    assert choice_predictions([-4.0, -2.0, -2.0], ["abcd", "ab", "éé"]) == (1, 0, 2)
    assert choice_predictions([-4.0, -2.1], ["abcd", "ab"])[1] == 0  # per char: -1.0 beats -1.05
    assert choice_predictions([-6.0, -4.0], ["ab", "éé"])[2] == 1  # per byte: -1.0 beats -3.0


def test_metric_counts_and_ignores_weight_zero_padding():
    metric = MultipleChoiceAccuracy()
    predictions = torch.tensor([[0, 1, 1], [2, 2, 0], [1, 1, 1]])
    metric.update(predictions, torch.tensor([0, 2, 0]), torch.tensor([1.0, 1.0, 0.0]))
    values = {k: float(v) for k, v in metric.compute().items()}
    assert values == {"acc": 1.0, "acc_norm": 0.5, "acc_bytes": 0.0, "count": 2.0}


def test_score_examples_agrees_with_per_choice_reference(decoder, tokenizer, task_file):
    encode = encoder(tokenizer)
    examples = read_examples(task_file)
    values = {k: float(v) for k, v in score_examples(decoder, encode, examples, prefix_token_id=0,
                                                     batch_size=3).compute().items()}
    hits = [0, 0, 0]
    for example in examples:
        lls = [reference(decoder, *encode_pair(encode, example.context, " " + c, 0))[0] for c in example.choices]
        for i, pred in enumerate(choice_predictions(lls, example.choices)):
            hits[i] += pred == example.gold
    assert [values["acc"], values["acc_norm"], values["acc_bytes"]] == [h / 5 for h in hits]
    assert values["count"] == 5


class _Holder(pl.LightningModule):
    """The smallest module the callback can serve: a Decoder under ``.model``."""

    def __init__(self, model: Decoder) -> None:
        super().__init__()
        self.model = model

    def validation_step(self, batch, batch_idx):
        return None


def test_callback_shares_examples_evenly_over_ranks(task_file):
    callback = MultipleChoiceEval(str(task_file), tokenizer="unused", batch_size=2)
    for world in (1, 2, 3, 4, 7):
        shares = [callback.share(rank, world) for rank in range(world)]
        assert len({len(examples) for examples, _ in shares}) == 1  # same forwards on every rank
        real = [e for examples, weights in shares for e, w in zip(examples, weights) if w == 1.0]
        assert sorted(real, key=repr) == sorted(callback.examples, key=repr)


def test_callback_logs_every_n_validations(decoder, tokenizer, task_file, tmp_path):
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    callback = MultipleChoiceEval(str(task_file), name="tiny", every_n_validations=2,
                                  tokenizer=str(tmp_path / "tokenizer.json"), prefix_token_id=0, batch_size=3)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    module, loader = _Holder(decoder), DataLoader([torch.zeros(1)])
    first = trainer.validate(module, dataloaders=loader, verbose=False)[0]
    second = trainer.validate(module, dataloaders=loader, verbose=False)[0]
    assert "val/mc/tiny/acc" not in first
    expected = score_examples(decoder, encoder(tokenizer), read_examples(task_file), prefix_token_id=0).compute()
    for key in ("acc", "acc_norm", "acc_bytes"):
        assert second[f"val/mc/tiny/{key}"] == pytest.approx(float(expected[key]))
    assert not decoder.training


def test_callback_rejects_bad_settings(task_file):
    with pytest.raises(ValueError, match="every_n_validations=0 is invalid"):
        MultipleChoiceEval(str(task_file), every_n_validations=0)
    with pytest.raises(ValueError, match="does not exist"):
        MultipleChoiceEval(str(task_file) + ".missing")


def test_pretraining_names_the_callback_by_class_path(task_file, capsys):
    """framework/ never imports eval/: a recipe reaches the callback by its class path."""
    from pathlib import Path

    from framework.training.pretrain import main as pretrain

    recipe = Path(__file__).resolve().parents[3] / "recipes" / "tiny.yaml"
    assert pretrain(["--config", str(recipe), "--trainer.callbacks+=eval.downstream.multiple_choice.MultipleChoiceEval",
                     f"--trainer.callbacks.path={task_file}", "--print_config"]) == 0
    printed = capsys.readouterr().out
    assert "class_path: eval.downstream.multiple_choice.MultipleChoiceEval" in printed and str(task_file) in printed


def test_the_prefix_token_is_what_the_run_s_documents_start_with(task_file, tmp_path):
    """A run on data whose documents start with BOS (a Llama-3 tokenizer) scores an empty
    context after BOS, as lm-eval's Hugging Face backend does; EOS-separated data after EOS."""
    from types import SimpleNamespace

    from tests.helpers.hf_tokenizer import llama3_tokenizer

    llama3_tokenizer(tmp_path / "tokenizer.json")
    for start, expected in (("bos", 0), ("eos", 1)):
        data = SimpleNamespace(tokenizer_path=str(tmp_path / "tokenizer.json"), eos_id=1,
                               manifest={"tokenizer": {"eos_id": 1, "bos_id": 0, "document_start": start}})
        callback = MultipleChoiceEval(str(task_file), batch_size=2)
        callback.setup(SimpleNamespace(datamodule=data), None, "validate")
        assert callback.prefix_token_id == expected
