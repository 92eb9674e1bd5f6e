"""framework.checkpoint.sharded.zero: the consolidation rules of DeepSpeed's flat fp32 partitions,
at a world size (3) and parameter sizes that leave padding everywhere. The files are
laid out here by hand following DeepSpeed's rules (ZeRO-2: each group's flat vector,
parameters back to back with their alignment padding, cut into one slice per rank;
ZeRO-3: every parameter cut into ceil(numel / world) elements per rank, the last padded,
each rank's parts back to back across its groups). Real 2-rank ZeRO-2/3 folders:
tests/distributed/test_checkpoint_forms.py."""

from __future__ import annotations

import math
import re
from collections import OrderedDict

import pytest
import torch

from framework.checkpoint import CheckpointError, load_decoder
from framework.config import ModelConfig
from framework.model.decoder import Decoder
from tests.helpers.battery import hashes, layerdrop, refusal

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


def write_folder(folder, decoder: Decoder, stage: int, config: dict | None = None) -> None:
    """The folder of ``decoder``'s weights; ``config`` replaces the recorded model config."""
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
                    "shared_params": {}, "global_step": 5, "layerdrop": {"model_config": config or decoder.config.to_dict()}}
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


# ------------------------------------------------------------------ a careless or hostile record (issue 23)


@pytest.mark.parametrize("change, message", [
    ({"n_layers": 100_000}, "missing ['blocks.2."),  # before: 10^5 blocks built, then allocated
    ({"d_model": 10_000_000}, "embed.weight has shape [37, 10] in the checkpoint, [37, 10000000] in the model"),
])
def test_the_recorded_config_is_checked_against_the_shapes_before_a_model_is_built(tmp_path, decoder, change,
                                                                                     message):
    folder = tmp_path / "last.ckpt"
    write_folder(folder, decoder, 3, config={**decoder.config.to_dict(), **change})
    before = hashes(folder)
    line = refusal(layerdrop("export", "--ckpt", folder, "--out", tmp_path / "copy", "--no-tokenizer", timeout=120))
    assert "does not match its config" in line and message in line
    assert hashes(folder) == before and not (tmp_path / "copy").exists()


@pytest.mark.parametrize("shape, message", [
    ((37, 10_000_000), "hold fewer fp32 weights than its parameter shapes need"),  # the record and the files disagree
    ((37, -10), "has shape (37, -10), not a list of sizes >= 0"),
])
@pytest.mark.parametrize("stage", [2, 3])
def test_recorded_shapes_the_partitions_cannot_fill_are_refused(tmp_path, decoder, shape, message, stage):
    folder = tmp_path / "last.ckpt"
    write_folder(folder, decoder, stage)
    states_file = next((folder / "checkpoint").glob("*model_states.pt"))
    states = torch.load(states_file, weights_only=True)
    states["param_shapes"][0]["model.embed.weight"] = torch.Size(shape) if min(shape) >= 0 else shape
    torch.save(states, states_file)
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_decoder(folder)
