"""What the libraries print that no user of a `layerdrop` command can act on, kept out
of every command's output (installed by the front door, framework/cli.py).

Each entry is a message that is either an advertisement or about code the user does
not own; a warning the user can act on (a bad setting, a slow configuration) is left
alone. Lightning's own information lines (devices found, why fit stopped) stay.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings

# Lightning's rank-zero info lines advertising its cloud products, and lines that say
# nothing to act on: the seed (it is in the resolved config), accelerators this project
# never uses, the restore (pretrain names the checkpoint it resumes from itself), and that
# pretrain's own model summary (framework/training/model_summary.py) replaces Lightning's.
ADVERTISEMENTS = ("💡 Tip:", "Seed set to ", "TPU available:", "HPU available:", "Restoring states from ",
                  "Trainer already configured with model summary callbacks")

# Warnings raised inside the libraries about the libraries' own use of each other.
LIBRARY_WARNINGS = (
    # Lightning 2.6's pytree helper calls a torch API torch 2.13 deprecates.
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # litdata's StreamingDataset has a length by design; its loader splits the
    # chunks between workers itself, so Lightning's guess does not apply.
    r"Your `IterableDataset` has `__len__` defined",
)

# Where Lightning's rank_zero_info writes (the fabric and the pytorch halves).
LIGHTNING_INFO_LOGGERS = ("lightning.fabric.utilities.rank_zero", "lightning.pytorch.utilities.rank_zero",
                          "lightning_utilities.core.rank_zero", "lightning.fabric.utilities.seed")


# Progress bars the libraries draw with tqdm on stderr, which in a log (stderr not a terminal)
# leave every redraw behind: lm-eval's request building has no switch of its own, so tqdm's
# (its defaults from TQDM_* variables, read when tqdm is imported: after the front door);
# huggingface_hub's covers the bars of datasets and transformers. A bar we draw ourselves
# passes `disable` explicitly and keeps its own rule; a value the user set is kept.
PROGRESS_BAR_SWITCHES = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}

_RANK_PREFIX = re.compile(r"^\[rank: \d+\] ")  # rank_prefixed_message's, on the seed line


class _DropAdvertisements(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _RANK_PREFIX.sub("", str(record.msg)).startswith(ADVERTISEMENTS)


def quiet_library_noise() -> None:
    """Install the filters (idempotent; imports no library); off a terminal, switch the
    libraries' progress bars off."""
    if not sys.stderr.isatty():
        for name, value in PROGRESS_BAR_SWITCHES.items():
            os.environ.setdefault(name, value)
    for message in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name in LIGHTNING_INFO_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropAdvertisements) for f in logger.filters):
            logger.addFilter(_DropAdvertisements())


__all__ = ["quiet_library_noise", "ADVERTISEMENTS", "LIBRARY_WARNINGS", "PROGRESS_BAR_SWITCHES"]
