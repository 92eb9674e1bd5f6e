"""The training loop of `layerdrop pretrain`: the command itself (``pretrain.py``), the
LightningModule (``module.py``) and what it trains with (data, parametrization, learning
rate schedule, initialisation from a checkpoint), the callbacks that watch a run
(summary, health, progress lines, the non-finite policy) and, in ``checkpointing/``, the
callbacks that write its checkpoints. What a command prints besides is framework/console/;
the early-exit loss's weights are framework/early_exit_loss.py (pure, below the config).
"""
