"""Library noise: advertisements and warnings about the libraries' own code are dropped;
everything else still reaches the user."""

from __future__ import annotations

import logging
import warnings

from framework.training.library_noise import LIGHTNING_INFO_LOGGERS, quiet_library_noise


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
