"""The training loop of `layerdrop pretrain`: the command itself (``pretrain.py``), the
LightningModule (``module.py``) and what it trains with (data, parametrization, learning
rate schedule, early-exit loss, initialisation from a checkpoint), the callbacks that
watch a run (summary, health, progress lines, the non-finite policy). What a command
prints besides is framework/console/; Lightning's private APIs are framework/strategies/lightning_internals.py's.
"""
