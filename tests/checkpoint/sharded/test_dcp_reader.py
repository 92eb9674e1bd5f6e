"""framework/checkpoint/sharded/dcp_reader.py: a DCP folder read whole in one process, as the
checkpoint dict a single file holds (the 2 -> 1 resume: an FSDP2 run continued under
``single``; end to end in tests/distributed/test_crash_resume.py)."""

from __future__ import annotations

import warnings

import pytest
import torch

from framework.checkpoint.base import CheckpointError
from framework.checkpoint.sharded.dcp import DcpFolder
from framework.config import ModelConfig
from framework.model.decoder import Decoder


class Holder(torch.nn.Module):
    """The LightningModule's layout: the decoder as ``model``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = Decoder(ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, max_seq_len=16,
                                         attention="sdpa"))


def optimizer_of(holder: Holder) -> torch.optim.Optimizer:
    decay = [p for n, p in holder.named_parameters() if p.ndim > 1]
    rest = [p for n, p in holder.named_parameters() if p.ndim <= 1]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1, "name": "decay"},
                              {"params": rest, "weight_decay": 0.0, "name": "rest"}], lr=1e-2)


def train_step(holder: Holder, optimizer: torch.optim.Optimizer, seed: int) -> None:
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(seed))
    logits = holder.model(tokens)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    optimizer.step()
    optimizer.zero_grad()


def save_like_model_parallel(holder: Holder, optimizer: torch.optim.Optimizer, folder) -> None:
    """What Lightning's ModelParallelStrategy writes: the model and optimizer through DCP
    (keyed by parameter name), the rest in meta.pt."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state = {"state_dict": get_model_state_dict(holder), "optimizer_0": get_optimizer_state_dict(holder, optimizer)}
    with warnings.catch_warnings():  # "torch.distributed is disabled ... single process": that is the point
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=folder, no_dist=True)
    torch.save({"global_step": 2, "loops": {"fit_loop": {"x": 1}}, "layerdrop": {"world": {"processes": 2}}},
               folder / "meta.pt")


def test_a_dcp_folder_resumes_in_one_process_exactly(tmp_path):
    holder, optimizer = Holder(), None
    optimizer = optimizer_of(holder)
    for seed in (1, 2):
        train_step(holder, optimizer, seed)
    save_like_model_parallel(holder, optimizer, tmp_path / "step-2.ckpt")

    checkpoint = DcpFolder().training_checkpoint(tmp_path / "step-2.ckpt")
    assert checkpoint["global_step"] == 2 and checkpoint["loops"] == {"fit_loop": {"x": 1}}
    assert checkpoint["layerdrop"] == {"world": {"processes": 2}}
    groups = checkpoint["optimizer_states"][0]["param_groups"]
    assert [g["name"] for g in groups] == ["decay", "rest"] and groups[0]["weight_decay"] == 0.1
    resumed = Holder()  # other weights until loaded
    resumed.load_state_dict(checkpoint["state_dict"])
    resumed_optimizer = optimizer_of(resumed)
    resumed_optimizer.load_state_dict(checkpoint["optimizer_states"][0])
    # The next step from the read state is the uninterrupted one, bit for bit (AdamW's
    # moments and step count came back, each on its own parameter).
    train_step(holder, optimizer, 3)
    train_step(resumed, resumed_optimizer, 3)
    for (name, want), got in zip(holder.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(got, want), name


def test_a_missing_shard_is_one_line(tmp_path):
    holder = Holder()
    optimizer = optimizer_of(holder)
    train_step(holder, optimizer, 1)
    save_like_model_parallel(holder, optimizer, tmp_path / "c")
    next((tmp_path / "c").glob("*.distcp")).unlink()
    with pytest.raises(CheckpointError, match="cannot be read") as refused:
        DcpFolder().training_checkpoint(tmp_path / "c")
    assert "\n" not in str(refused.value) and "distcp" in str(refused.value), str(refused.value)
