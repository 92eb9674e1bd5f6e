"""The model summary at the start of fit carries the project's FLOP count, not Lightning's 0."""

from __future__ import annotations

import re

from lightning.pytorch.utilities.model_summary import get_human_readable_count

from framework.flops import dense_step_flops
from framework.training.model_summary import FlopCountedSummary
from framework.training.pretrain import main
from tests.helpers.tiny_training import SEQ, RandomTokens, quiet_trainer, tiny_cli_args, tiny_module


def test_the_table_counts_one_dense_forward_of_a_micro_batch(capsys, caplog):
    module = tiny_module()
    trainer = quiet_trainer(max_steps=2, enable_model_summary=True, callbacks=[FlopCountedSummary()])
    trainer.fit(module, RandomTokens(batch_size=4))
    out = capsys.readouterr()
    text = out.out + out.err
    expected = get_human_readable_count(int(dense_step_flops(module.model_cfg, 4, SEQ, training=False).total))
    assert re.search(rf"Total FLOPs\W+{re.escape(expected)}", text), text
    assert re.search(rf"\bmodel\b.*Decoder.*\b{re.escape(expected)}\b", text), text  # the decoder's row
    assert f"one dense forward of a micro-batch (4 × {SEQ} tokens" in caplog.text  # Lightning's info logger


def test_pretrain_prints_no_zero_flops(prepared_tokens, tmp_path, capfd, caplog):
    """Lightning's default summary said `Total FLOPs: 0` in every pretrain log."""
    args = [*tiny_cli_args(prepared_tokens, tmp_path / "run", steps=2), "--trainer.enable_model_summary", "true"]
    assert main(args) == 0
    out, err = capfd.readouterr()
    assert "Total FLOPs" in out + err and not re.search(r"Total FLOPs\W+0\b", out + err)
    assert "one dense forward of a micro-batch (4 × 32 tokens" in caplog.text
