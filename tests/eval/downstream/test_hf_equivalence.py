"""The packaged suite scores what the community's tools score: the same lm-eval tasks,
run through our ``layerdrop`` model and through lm-eval's own ``hf`` model (HFLM) on one
small random LlamaForCausalLM, give the same per-request log-likelihoods and the same
accuracies; our early exit at K equals HFLM on a copy of the model cut to K layers."""

from __future__ import annotations

import shutil

import pytest
import torch

from eval.downstream.harness import force_offline
from eval.downstream.packaged_tasks import build_task, read_split, PACKAGED
from tests.eval.tiny_lm import EOS, train_tokenizer
from tests.helpers.hf_llama import tiny_hf_config

force_offline()
TASKS = ("piqa", "arc_easy")
LIMIT = 8
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """A random 4-layer Llama saved as a Hugging Face folder, a BPE tokenizer (vocab 512)
    trained on the tasks' own text beside it."""
    from transformers import LlamaForCausalLM

    texts = []
    for name in TASKS:
        for doc in read_split(PACKAGED[name]).select(range(40)):
            texts += [str(value) for value in doc.values()]
    tokenizer = train_tokenizer(texts, vocab_size=512)
    config = tiny_hf_config(vocab=tokenizer.get_vocab_size(), layers=4, std=0.1)
    config.max_position_embeddings = 1024  # every context fits: no truncation rule compared
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("equivalence") / "hf"
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder, model


def hf_tokenizer(folder):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), eos_token=EOS)


def truncated(model, layers: int):
    """The same weights, the blocks after ``layers`` removed (the final norm and head kept)."""
    from transformers import LlamaForCausalLM

    config = model.config.__class__.from_dict(model.config.to_dict())
    config.num_hidden_layers = layers
    cut = LlamaForCausalLM(config).eval()
    missing, _ = cut.load_state_dict(model.state_dict(), strict=False)
    assert not missing
    return cut


def scored(lm) -> dict:
    """lm-eval's results for the packaged tasks (fresh task objects, the first LIMIT documents)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    tasks = [build_task(name, prefer_cache=False)[0] for name in TASKS]
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, limit=LIMIT, log_samples=True, bootstrap_iters=0,
                                   task_manager=TaskManager(include_defaults=False), random_seed=0,
                                   numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)


def compare(ours: dict, theirs: dict) -> float:
    """The largest |Δ log-likelihood| over every request; accuracies must be identical."""
    worst = 0.0
    for task in TASKS:
        mine = sorted(ours["samples"][task], key=lambda s: s["doc_id"])
        hers = sorted(theirs["samples"][task], key=lambda s: s["doc_id"])
        assert [s["doc_id"] for s in mine] == [s["doc_id"] for s in hers] == list(range(LIMIT))
        for a, b in zip(mine, hers):
            assert a["arguments"] == b["arguments"]  # the same prompts and continuations
            lls_a = [float(r[0][0]) for r in a["resps"]]
            lls_b = [float(r[0][0]) for r in b["resps"]]
            worst = max(worst, *(abs(x - y) for x, y in zip(lls_a, lls_b)))
            assert a["acc"] == b["acc"] and a["acc_norm"] == b["acc_norm"], (task, a["doc_id"])
        for metric in ("acc,none", "acc_norm,none"):
            assert ours["results"][task][metric] == theirs["results"][task][metric]
    return worst


@pytest.mark.parametrize("exit_layer", [None, 2], ids=["full", "exit2"])
def test_our_model_scores_the_packaged_tasks_as_lm_evals_hf_model(hf_model, exit_layer):
    from lm_eval.models.huggingface import HFLM

    from eval.downstream.lm_eval_adapter import LayerDropLM

    folder, model = hf_model
    reference = model if exit_layer is None else truncated(model, exit_layer)
    theirs = scored(HFLM(pretrained=reference, tokenizer=hf_tokenizer(folder), batch_size=4, device="cpu"))
    ours = scored(LayerDropLM(ckpt=str(folder), exit_layer=exit_layer, batch_size=4, device="cpu"))
    worst = compare(ours, theirs)
    print(f"max |delta loglik| ({'full' if exit_layer is None else f'exit {exit_layer}'}): {worst:.2e}")
    assert worst < TOLERANCE
