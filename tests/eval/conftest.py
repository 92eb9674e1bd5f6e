"""Shared fixtures of the eval tests."""

import sysconfig

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models only lose from intra-op threads (and under pytest -n 2 they fight)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def small_data(tmp_path_factory):
    """A real `layerdrop prepare` folder, made once: the json package's sources, a trained
    byte-level BPE of 300 entries, 30% of the documents in the validation split."""
    from data_prep.prepare import main as prepare

    out = tmp_path_factory.mktemp("small_data") / "data"
    stdlib = sysconfig.get_paths()["stdlib"]
    assert prepare(["--no-progress", "--files", f"{stdlib}/json/*.py", "--tokenizer", "train", "--vocab-size", "300",
                    "--out", str(out), "--val-fraction", "0.3", "--chunk-tokens", "2048", "--workers", "1"]) == 0
    return out

