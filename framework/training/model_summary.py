"""Lightning's model summary at the start of fit, with this project's FLOP count.

Lightning fills the summary's FLOPs column and its ``Total FLOPs`` line by running the
module's ``example_input_array`` under torch's FLOP counter. LayerDropModule has none
(a forward at start-up would cost a step of a large model and, sharded, a collective), so
Lightning printed ``Total FLOPs: 0`` in a tool whose headline is FLOPs saved. Here the
decoder's row and the total are framework/flops.py's count of one dense forward
over a micro-batch (``data.batch_size`` × ``data.seq_len`` tokens), the count the
FLOPs-saved figures are made of; a training step runs 3× that, less what layer dropout
skips.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelSummary, RichModelSummary
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_summary import get_human_readable_count

from framework.flops import dense_step_flops

# Lightning's own choice of table (callback_connector): rich when it is installed.
_TABLE = RichModelSummary if find_spec("rich") is not None else ModelSummary


def micro_batch_shape(trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[int, int]:
    """(sequences, tokens each) of one micro-batch: the data module's, else one full-context sequence."""
    data = trainer.datamodule
    return (int(getattr(data, "batch_size", 1)),
            int(getattr(data, "seq_len", pl_module.model_cfg.max_seq_len)))


class FlopCountedSummary(_TABLE):
    """Lightning's summary table (rich or plain, as Lightning would pick) whose FLOPs are
    one dense forward of a micro-batch, counted by framework/flops.py.

    Args:
        max_depth: nesting depth of the table, as Lightning's (0: no table).
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        super().__init__(max_depth, **summarize_kwargs)
        self._decoder_row = "model"  # LayerDropModule's attribute holding the Decoder
        self._flops = 0
        self._shape = (1, 1)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._shape = micro_batch_shape(trainer, pl_module)
        self._flops = int(dense_step_flops(pl_module.model_cfg, *self._shape, training=False).total)
        super().on_fit_start(trainer, pl_module)

    def summarize(self, summary_data: list[tuple[str, list[str]]], total_parameters: int,
                  trainable_parameters: int, model_size: float, total_training_modes: dict[str, int],
                  total_flops: int, **summarize_kwargs: Any) -> None:
        names = dict(summary_data)["Name"]
        counted = get_human_readable_count(self._flops)
        data = [(column, [counted if name == self._decoder_row else value for name, value in zip(names, values)])
                if column == "FLOPs" else (column, values) for column, values in summary_data]
        super().summarize(data, total_parameters, trainable_parameters, model_size, total_training_modes,
                          total_flops=self._flops, **summarize_kwargs)
        batch, seq = self._shape
        rank_zero_info(f"FLOPs above: one dense forward of a micro-batch ({batch} × {seq} tokens, "
                       "framework/flops.py); a training step runs 3× that, less what layer dropout skips")


__all__ = ["FlopCountedSummary", "micro_batch_shape"]
