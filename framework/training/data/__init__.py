"""Training data: a `layerdrop prepare` folder or a weighted mixture of them, as batches.

    data_module.py      TokenDataModule: the LightningDataModule (one folder or data.mixture)
    mixture.py          data.mixture parsed and checked; phases of weights
    mixture_loader.py   batches of a mixture from per-source litdata loaders, exact resume
    source_tokens.py    tokens trained on per source (TensorBoard, progress line, summary.json)
"""

from framework.training.data.data_module import FixedBlocks, TokenDataModule, shift_collate, spread_indices

__all__ = ["TokenDataModule", "FixedBlocks", "shift_collate", "spread_indices"]
