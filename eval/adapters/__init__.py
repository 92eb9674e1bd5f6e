"""Balcony-style exit adapters on a frozen backbone: the adapter blocks and their files
(exit_adapters), training by self-distillation (fit: `layerdrop adapters fit`), and the
per-exit comparison with plain early exit (evaluation: `layerdrop adapters eval`)."""
