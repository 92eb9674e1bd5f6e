"""layerdrop's library: model, layer dropout, schedules, training loop, strategies."""

__version__ = "0.1.0"
