"""Library noise: advertisements and warnings about the libraries' own code are dropped;
everything else still reaches the user."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from framework.console.library_noise import LIGHTNING_INFO_LOGGERS, PROGRESS_BAR_SWITCHES, quiet_library_noise


@pytest.fixture(autouse=True)
def keep_the_environment(monkeypatch):
    """quiet_library_noise sets the progress-bar switches in os.environ (pytest's stderr is
    not a terminal): restored after each test."""
    for name in PROGRESS_BAR_SWITCHES:
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)


def test_library_warnings_are_dropped_and_others_kept():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_library_noise()
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use TreeSpec", FutureWarning)
        warnings.warn("Your `IterableDataset` has `__len__` defined. In combination with ...", UserWarning)
        warnings.warn("the learning rate is very large", UserWarning)
    assert [str(w.message) for w in caught] == ["the learning rate is very large"]


def test_lightning_advertisements_are_dropped_and_its_information_kept():
    quiet_library_noise()
    quiet_library_noise()  # idempotent: one filter per logger
    for name in LIGHTNING_INFO_LOGGERS:
        logger = logging.getLogger(name)
        assert len(logger.filters) == 1
        tip = logger.makeRecord(name, logging.INFO, __file__, 1, "💡 Tip: For seamless cloud logging ...", (), None)
        info = logger.makeRecord(name, logging.INFO, __file__, 1, "GPU available: False, used: False", (), None)
        assert not logger.filter(tip) and logger.filter(info)


def test_the_seed_and_unused_accelerator_lines_are_dropped():
    """The issue's noise: "Seed set to 1234", "TPU available: False", "Restoring states ..."."""
    quiet_library_noise()
    seed = logging.getLogger("lightning.fabric.utilities.seed")
    assert not seed.filter(seed.makeRecord(seed.name, logging.INFO, __file__, 1, "[rank: 0] Seed set to 1234", (),
                                           None))
    info = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    for line in ("TPU available: False, using: 0 TPU cores", "Restoring states from the checkpoint path at x"):
        assert not info.filter(info.makeRecord(info.name, logging.INFO, __file__, 1, line, (), None))


def test_library_progress_bars_stay_out_of_a_log():
    """lm-eval builds its requests under a plain tqdm bar (no switch of its own): in a log
    every redraw was left behind. A bar that passes `disable` itself keeps its own rule."""
    script = ("from framework.console.library_noise import quiet_library_noise; quiet_library_noise()\n"
              "from tqdm import tqdm\n"
              "for _ in tqdm(range(3), desc='building requests'): pass\n"
              "for _ in tqdm(range(3), desc='our own bar', disable=False): pass\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2], env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stderr
    assert "building requests" not in done.stderr and "our own bar" in done.stderr


def test_a_users_own_progress_bar_setting_is_kept(monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "")
    quiet_library_noise()
    assert os.environ["TQDM_DISABLE"] == "" and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
