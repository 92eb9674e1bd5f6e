"""Parallelism, applied from outside the model, and the strategies a recipe names.

    parallelize.py      activation checkpointing -> torch.compile -> FSDP2, per block
    fsdp2.py            FSDP2Strategy / HSDPStrategy (Lightning strategies) and their precision policy
    entry.py            what one registry entry says about its strategy (the defaults)
    deepspeed_zero.py   the DeepSpeed ZeRO-2/3 entries: what they do differently
    registry.py         STRATEGIES (name -> entry), build_strategy, entry_of
    lightning_internals.py  the private Lightning APIs the strategies reach into, in one place

The names below are the package's public ones; recipes name the Lightning classes as
``framework.strategies.FSDP2Strategy`` / ``framework.strategies.HSDPStrategy``.
"""

from framework.strategies.deepspeed_zero import full_parameters
from framework.strategies.entry import Layout, NamedStrategy
from framework.strategies.fsdp2 import (FSDP2_PRECISIONS, PARAM_DTYPES, REDUCE_DTYPES, FSDP2Strategy, HSDPStrategy,
                                        check_dtype_names, mixed_precision_of, mixed_precision_policy)
from framework.strategies.parallelize import checkpoint_block, compile_block, fsdp_mesh, parallelize, shard
from framework.strategies.registry import (ACCELERATORS, STRATEGIES, build_strategy, entry_of,
                                           precision_for, resolve_accelerator, resolve_layout)

__all__ = ["parallelize", "checkpoint_block", "compile_block", "shard", "fsdp_mesh", "full_parameters",
           "FSDP2Strategy", "HSDPStrategy", "mixed_precision_policy", "mixed_precision_of", "check_dtype_names",
           "PARAM_DTYPES", "REDUCE_DTYPES", "FSDP2_PRECISIONS", "Layout", "NamedStrategy", "STRATEGIES",
           "entry_of", "build_strategy", "resolve_accelerator", "resolve_layout", "precision_for", "ACCELERATORS"]
