"""The lm-eval adapter on small local tasks, offline, against slow references."""

import os

import pytest
import torch
import torch.nn.functional as F

from eval.downstream.harness import force_offline

force_offline()  # before lm-eval imports `datasets`: nothing may reach a hub

import lm_eval  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from eval.downstream.lm_eval_adapter import LayerDropLM  # noqa: E402
from framework.tokenizer import TextCodec  # noqa: E402
from framework.checkpoint import Checkpoint, CheckpointError, load_decoder  # noqa: E402
from eval.downstream.multiple_choice import encode_pair, read_examples, score_examples  # noqa: E402
from eval.decoding.sampling import Sampling  # noqa: E402
from tests.eval.tiny_lm import FIXTURES, TASKS, export_tiny_model  # noqa: E402

ALL_TASKS = ["ld_tiny_mc", "ld_tiny_loglik", "ld_tiny_rolling", "ld_tiny_gen"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return export_tiny_model(tmp_path_factory.mktemp("tiny_lm") / "model")


@pytest.fixture(scope="module")
def harness(model_dir, tmp_path_factory):
    """One simple_evaluate over the four local tasks (data files resolve from the
    fixtures folder; the data set cache goes to a temporary folder)."""
    import datasets.config

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(FIXTURES)
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_cache"))
        manager = TaskManager(include_path=str(TASKS), include_defaults=False)
        results = lm_eval.simple_evaluate(model="layerdrop", model_args={"ckpt": str(model_dir)}, tasks=ALL_TASKS,
                                          task_manager=manager, batch_size=3, bootstrap_iters=0, log_samples=True)
    return results


@pytest.fixture(scope="module")
def lm(model_dir):
    return LayerDropLM(ckpt=str(model_dir), batch_size=2)


def test_every_output_type_gives_the_slow_references_values(harness, model_dir):
    """Each task's metric equals what one plain forward per request gives."""
    import json
    import math

    lm = LayerDropLM(ckpt=str(model_dir))
    results = harness["results"]
    rows = [json.loads(line) for line in (FIXTURES / "loglik.jsonl").read_text().splitlines()]
    lls = [reference_logprob(lm.decoder, *encode_pair(lm.tok_encode, r["context"], r["target"], lm.eot_token_id))
           for r in rows]
    assert results["ld_tiny_loglik"]["perplexity,none"] == pytest.approx(math.exp(-sum(lls) / len(lls)), rel=1e-4)
    docs = [json.loads(line)["text"] for line in (FIXTURES / "text.jsonl").read_text().splitlines()]
    total = sum(reference_logprob(lm.decoder, [lm.eot_token_id], lm.tok_encode(d)) for d in docs)
    bits = -total / sum(len(d.encode()) for d in docs) / math.log(2)
    assert results["ld_tiny_rolling"]["bits_per_byte,none"] == pytest.approx(bits, rel=1e-4)
    examples = read_examples(FIXTURES / "mc.jsonl")
    native = score_examples(lm.decoder, lm.tok_encode, examples, prefix_token_id=lm.eot_token_id).compute()
    assert results["ld_tiny_mc"]["acc,none"] == pytest.approx(float(native["acc"]), abs=1e-12)
    # Generation: each logged answer is the slow greedy continuation cut at the first stop string.
    samples = sorted(harness["samples"]["ld_tiny_gen"], key=lambda s: s["doc_id"])
    hits = 0
    for sample in samples:
        question, answer = sample["doc"]["question"], sample["doc"]["answer"]
        text = lm.tok_decode(greedy_reference(lm.decoder, lm.tok_encode(question), 6, eos=lm.eot_token_id))
        for stop in ("\n", "."):
            text = text.split(stop, 1)[0]
        assert sample["resps"][0][0] == text
        hits += text == answer
    assert results["ld_tiny_gen"]["exact_match,none"] == hits / len(samples)
    assert harness["config"]["num_layers"] == 3  # get_model_info reached the report
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"


def test_native_scorer_matches_lm_eval_on_the_same_task(harness, model_dir):
    decoder, _ = load_decoder(model_dir)
    adapter = LayerDropLM(ckpt=str(model_dir))
    examples = read_examples(FIXTURES / "mc.jsonl")
    metric = score_examples(decoder, adapter.tok_encode, examples, prefix_token_id=adapter.eot_token_id)
    native = {k: float(v) for k, v in metric.compute().items()}
    lm_eval_mc = harness["results"]["ld_tiny_mc"]
    for name in ("acc", "acc_norm", "acc_bytes"):
        assert native[name] == pytest.approx(lm_eval_mc[f"{name},none"], abs=1e-12)
    # ... and choice by choice, the same log-likelihoods.
    samples = sorted(harness["samples"]["ld_tiny_mc"], key=lambda s: s["doc_id"])
    for sample, example in zip(samples, examples):
        lm_eval_lls = [resp[0][0] for resp in sample["resps"]]
        native_lls = [adapter.loglikelihood([Instance("loglikelihood", {}, (example.context, " " + c), 0)],
                                            disable_tqdm=True)[0][0] for c in example.choices]
        assert lm_eval_lls == pytest.approx(native_lls, abs=1e-5)


def reference_logprob(decoder, context_ids, continuation_ids, **forward):
    """Slow: one forward over the whole sequence, sum of the continuation's log-probs."""
    tokens = torch.tensor([context_ids + continuation_ids])
    with torch.no_grad():
        logprobs = F.log_softmax(decoder(tokens[:, :-1], **forward)[0].double(), dim=-1)
    n = len(continuation_ids)
    return float(logprobs[-n:].gather(-1, torch.tensor(continuation_ids)[:, None]).sum())


def test_loglikelihood_equals_the_slow_reference(lm):
    requests = [("The sun rises in the", " east"), ("Ice cream tastes  ", "sweet"), ("", "Snow is white")]
    results = lm.loglikelihood([Instance("loglikelihood", {}, r, i) for i, r in enumerate(requests)],
                               disable_tqdm=True)
    for (context, continuation), (value, is_greedy) in zip(requests, results):
        if context:
            stripped = context.rstrip()
            ctx_ids = lm.tok_encode(stripped)
            cont_ids = lm.tok_encode(context + continuation)[len(ctx_ids):]
        else:
            ctx_ids, cont_ids = [lm.eot_token_id], lm.tok_encode(continuation)
        assert value == pytest.approx(reference_logprob(lm.decoder, ctx_ids, cont_ids), abs=1e-4)
        assert is_greedy == reference_is_greedy(lm.decoder, ctx_ids, cont_ids)


def test_lm_evals_tokenizing_bar_stays_out_of_a_log(lm, capsys):
    """lm-eval asks with disable_tqdm=False: its "Tokenizing inputs" bar drew every frame into logs."""
    requests = [("The sun rises in the", " east"), ("Ice cream tastes  ", "sweet")]
    quiet = lm.loglikelihood([Instance("loglikelihood", {}, r, i) for i, r in enumerate(requests)])
    assert "Tokenizing inputs" not in capsys.readouterr().err  # pytest's stderr is not a terminal
    shown = lm.loglikelihood([Instance("loglikelihood", {}, r, i) for i, r in enumerate(requests)],
                             disable_tqdm=True)
    assert quiet == shown


def test_rolling_loglikelihood_counts_every_token_once(model_dir):
    text = "The sun rises in the east and sets in the west."
    wide = LayerDropLM(ckpt=str(model_dir))
    tokens = wide.tok_encode(text)
    single = wide.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)], disable_tqdm=True)[0]
    assert single == pytest.approx(reference_logprob(wide.decoder, [wide.eot_token_id], tokens), abs=1e-4)
    narrow = LayerDropLM(ckpt=str(model_dir), max_length=8, batch_size=3)
    windowed = narrow.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)],
                                            disable_tqdm=True)[0]
    # The reference: each token conditioned on at most the 8 tokens before it in its
    # window; windows of lm-eval's rule (first: prefix + 7 tokens; then disjoint).
    expected, done, padded = 0.0, 0, [wide.eot_token_id] + tokens
    while done < len(tokens):
        end = min(done + 8, len(tokens))
        start = max(0, end - 8)
        window = padded[start:end + 1]
        new = end - done
        expected += reference_logprob(wide.decoder, window[:-new], window[-new:])
        done = end
    assert windowed == pytest.approx(expected, abs=1e-4)
    assert windowed != pytest.approx(single, abs=1e-3)  # the window size really changed the context


def reference_is_greedy(decoder, context_ids, continuation_ids):
    tokens = torch.tensor([context_ids + continuation_ids])
    with torch.no_grad():
        picked = decoder(tokens[:, :-1])[0, -len(continuation_ids):].argmax(-1)
    return picked.tolist() == continuation_ids


def greedy_reference(decoder, prompt, steps, eos=None, **forward):
    """Slow greedy decoding: a whole forward per token, no cache; stops before EOS."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            token = int(decoder(torch.tensor([tokens]), **forward)[0, -1].argmax())
            if token == eos:
                break
            tokens.append(token)
    return tokens[len(prompt):]


@pytest.mark.parametrize("model_args", [{}, {"exit_layer": "2"}, {"skip_layers": "1"}, {"skip_layers": [0, 2]}])
def test_greedy_decoding_with_the_cache_equals_recomputing(model_dir, model_args):
    lm = LayerDropLM(ckpt=str(model_dir), **model_args)
    prompt = lm.tok_encode("Birds fly with their")
    forward = {"exit_layer": lm.exit_layer, "skip_layers": lm.skip_layers}
    assert lm.greedy_tokens(prompt, 6) == greedy_reference(lm.decoder, prompt, 6, eos=lm.eot_token_id, **forward)


def test_generation_stops_at_the_first_stop_string(lm):
    context = "Snow is usually"
    full = lm.tok_decode(lm.greedy_tokens(lm.tok_encode(context), 8))
    assert len(full) >= 3
    stop = full[2]
    out = lm.generate_until([Instance("generate_until", {}, (context, {"until": [stop], "max_gen_toks": 8}), 0)],
                            disable_tqdm=True)[0]
    assert out == full.split(stop, 1)[0] and stop not in out


def test_batched_generate_until_equals_each_request_alone(lm):
    contexts = ["Snow is usually", "The sun rises in the east and", "Fish", "Birds fly with their wings over"]
    requests = [Instance("generate_until", {}, (c, {"until": ["\n"], "max_gen_toks": 7}), i)
                for i, c in enumerate(contexts)]
    outputs = lm.generate_until(requests, disable_tqdm=True)  # batch_size 2: two padded batches
    for context, out in zip(contexts, outputs):
        text = lm.tok_decode(greedy_reference(lm.decoder, lm.tok_encode(context), 7, eos=lm.eot_token_id))
        assert out == text.split("\n", 1)[0]


def test_generation_arguments_follow_hugging_face_semantics(lm):
    assert lm._generation_args({"until": "x"})[0] == ["x"]
    assert lm._generation_args({"temperature": 0.0})[2] == Sampling()
    assert lm._generation_args({"do_sample": False, "temperature": 0.7})[2] == Sampling()
    assert lm._generation_args({"temperature": 0.7})[2] == Sampling(0.7)
    assert lm._generation_args({"do_sample": True, "top_k": 5, "top_p": 0.9})[2] == Sampling(1.0, 5, 0.9)
    sampled = [Instance("generate_until", {}, ("Snow is", {"do_sample": True, "temperature": 1.0}), 0)]
    first = lm.generate_until(sampled, disable_tqdm=True)
    assert lm.generate_until(sampled, disable_tqdm=True) == first  # seeded: reproducible


def test_a_budget_longer_than_the_context_is_capped(lm, caplog):
    assert lm.max_gen_toks == 32  # the default: 256, at most half of max_length 64
    with caplog.at_level("WARNING"):
        assert lm._generation_args({"max_gen_toks": 64})[1] == 32
    assert "does not fit max_length=64" in caplog.text


@pytest.mark.parametrize("gen_kwargs, message", [
    ({"num_beams": 4}, "num_beams=4 is not supported"),
    ({"repetition_penalty": 1.2}, "not supported by the layerdrop model"),
    ({"do_sample": True, "top_p": 1.5}, "top_p=1.5 is invalid"),
])
def test_unsupported_generation_arguments_are_refused(lm, gen_kwargs, message):
    with pytest.raises(ValueError, match=message):
        lm.generate_until([Instance("generate_until", {}, ("Hi", gen_kwargs), 0)], disable_tqdm=True)


@pytest.mark.parametrize("model_args, message", [
    ({"exit_layer": 0}, r"exit_layer=0 is invalid: must be an integer in 1..3"),
    ({"exit_layer": 4}, r"exit_layer=4 is invalid: must be an integer in 1..3"),
    ({"exit_layer": "two"}, r"exit_layer='two' is invalid: must be an integer in 1..3"),
    ({"skip_layers": "2;3"}, r"layers \[3\] are outside 0..2"),
    ({"batch_size": "auto"}, "batch_size='auto' is not supported"),
    ({"batch_size": 0}, "batch_size=0 is invalid"),
    ({"eot_token": "<nope>"}, "'<nope>' is not in the vocabulary of"),
])
def test_bad_model_arguments_are_clear_errors(model_dir, model_args, message):
    with pytest.raises(ValueError, match=message):
        LayerDropLM(ckpt=str(model_dir), **model_args)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        LayerDropLM(ckpt=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="needs ckpt=PATH"):
        LayerDropLM()


def test_tokenizer_is_found_beside_the_checkpoint_or_in_its_data_folder(model_dir, tmp_path):
    codec = TextCodec.for_checkpoint(Checkpoint.open(model_dir))
    assert codec.path == model_dir / "tokenizer.json"
    # A Lightning checkpoint in runs/x/checkpoints/ whose run read data/: the manifest's tokenizer.
    data = tmp_path / "data"
    data.mkdir()
    (data / "tok.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    (data / "manifest.json").write_text('{"tokenizer": {"file": "tok.json", "eos_id": 0}}')
    ckpt = tmp_path / "runs" / "x" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"state_dict": {}, "datamodule_hyper_parameters": {"data_dir": str(data)}}, ckpt)
    codec = TextCodec.for_checkpoint(Checkpoint.open(ckpt))
    assert (codec.path, codec.eos_id) == (data / "tok.json", 0)
    (data / "tok.json").unlink()
    with pytest.raises(ValueError, match="no tokenizer found for checkpoint"):
        TextCodec.for_checkpoint(Checkpoint.open(ckpt))


def test_the_prefix_token_of_a_bos_model_is_its_bos(model_dir, tmp_path):
    """lm-eval's HF backend puts BOS before an empty context where the tokenizer has one."""
    from tests.helpers.hf_llama import tiny_hf_llama
    from tests.helpers.hf_tokenizer import llama3_tokenizer

    assert LayerDropLM(ckpt=str(model_dir)).prefix_token_id == 0  # our BPE: after EOS (id 0)
    folder = tmp_path / "hf"
    tiny_hf_llama(folder, vocab=300, layers=2)
    llama3_tokenizer(folder / "tokenizer.json")
    lm = LayerDropLM(ckpt=str(folder))
    assert (lm.prefix_token_id, lm.eot_token_id) == (0, 1)
