"""framework.checkpoint.zero: the consolidation rules of DeepSpeed's flat fp32 partitions,
at a world size (3) and parameter sizes that leave padding everywhere. The files are
laid out here by hand following DeepSpeed's rules (ZeRO-2: each group's flat vector,
parameters back to back with their alignment padding, cut into one slice per rank;
ZeRO-3: every parameter cut into ceil(numel / world) elements per rank, the last padded,
each rank's parts back to back across its groups). Real 2-rank ZeRO-2/3 folders:
tests/distributed/test_checkpoint_forms.py."""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch

from framework.checkpoint import CheckpointError, load_decoder
from framework.config import ModelConfig
from framework.model import Decoder

WORLD = 3


@pytest.fixture
def decoder() -> Decoder:
    torch.manual_seed(0)
    return Decoder(ModelConfig(vocab_size=37, d_model=10, n_layers=2, n_heads=2, max_seq_len=8)).eval()


def groups_of(decoder: Decoder) -> list[OrderedDict]:
    """Two parameter groups, as the optimizer has them (weights, then the rest)."""
    state = decoder.state_dict()
    weights = OrderedDict((f"model.{k}", v) for k, v in state.items() if v.dim() == 2)
    rest = OrderedDict((f"model.{k}", v) for k, v in state.items() if v.dim() != 2)
    return [weights, rest]


def write_folder(folder, decoder: Decoder, stage: int) -> None:
    (folder / "checkpoint").mkdir(parents=True)
    (folder / "latest").write_text("checkpoint")
    groups = groups_of(decoder)
    shapes = [OrderedDict((k, v.shape) for k, v in g.items()) for g in groups]
    per_rank: list[dict] = [{"zero_stage": stage, "partition_count": WORLD if stage == 3 else [WORLD, WORLD]}
                            for _ in range(WORLD)]
    if stage == 2:
        paddings = [[1] * len(g) for g in groups]  # DeepSpeed may pad after each parameter
        for rank in per_rank:
            rank["single_partition_of_fp32_groups"], rank["param_alignment_paddings"] = [], paddings
        for group, padding in zip(groups, paddings):
            flat = torch.cat([torch.cat([v.reshape(-1), torch.full((p,), 7.0)]) for v, p in zip(group.values(), padding)])
            flat = torch.cat([flat, torch.zeros(-flat.numel() % (2 * WORLD))])
            for rank, part in zip(per_rank, flat.chunk(WORLD)):
                rank["single_partition_of_fp32_groups"].append(part.clone())
    else:
        for index, rank in enumerate(per_rank):
            rank["fp32_flat_groups"] = []
            for group in groups:
                parts = []
                for value in group.values():
                    size = math.ceil(value.numel() / WORLD)
                    padded = torch.cat([value.reshape(-1), torch.full((size * WORLD - value.numel(),), 7.0)])
                    parts.append(padded[index * size:(index + 1) * size])
                rank["fp32_flat_groups"].append(torch.cat(parts))
    model_states = {"module": {}, "buffer_names": [], "param_shapes": shapes, "frozen_param_shapes": {},
                    "shared_params": {}, "global_step": 5, "layerdrop": {"model_config": decoder.config.to_dict()}}
    name = "mp_rank_00_model_states.pt" if stage == 2 else "zero_pp_rank_0_mp_rank_00_model_states.pt"
    torch.save(model_states, folder / "checkpoint" / name)
    for index, rank in enumerate(per_rank):
        torch.save({"optimizer_state_dict": rank},
                   folder / "checkpoint" / f"zero_pp_rank_{index}_mp_rank_00_optim_states.pt")


@pytest.mark.parametrize("stage", [2, 3])
def test_partitions_are_put_back_together_exactly(tmp_path, decoder, stage):
    write_folder(tmp_path / "last.ckpt", decoder, stage)
    loaded, cfg = load_decoder(tmp_path / "last.ckpt")
    assert cfg == decoder.config
    for (name, a), (_, b) in zip(loaded.state_dict().items(), decoder.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_a_missing_rank_is_refused(tmp_path, decoder):
    write_folder(tmp_path / "last.ckpt", decoder, 3)
    (tmp_path / "last.ckpt" / "checkpoint" / "zero_pp_rank_2_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(CheckpointError, match="written by 3 ranks but holds 2 optimizer files"):
        load_decoder(tmp_path / "last.ckpt")
