"""A checkpoint's size known before it is written: exact for a single file, the same bytes
as torch's distributed checkpoint writes for a DCP folder, its index allowed for."""

from __future__ import annotations

import io
import warnings

import pytest
import torch

from framework.checkpoint.saved_size import dcp_part_bytes, torch_save_bytes


def training_state() -> dict:
    """A checkpoint's parts as Lightning hands them over: a model's tensors (one a view into
    a larger storage, as FSDP2's padded shards are), AdamW's state after a step (tensors,
    numbers, a list of parameter groups) and plain entries."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(37, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 11))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 37)).sum().backward()
    optimizer.step()
    return {"state_dict": {**model.state_dict(), "view": torch.arange(100.0)[10:20]},
            "optimizer_0": optimizer.state_dict(), "global_step": 7, "loops": {"fit": {"epoch": [0, 1]}}}


def test_a_single_file_is_counted_to_the_byte_without_writing_it():
    state = training_state()
    written = io.BytesIO()
    torch.save(state, written)
    assert torch_save_bytes(state) == len(written.getvalue())
    tensors = sum(t.numel() * t.element_size() for t in state["state_dict"].values())
    assert torch_save_bytes(state) > tensors  # the pickle, headers and alignment the old estimate left out


def test_a_dcp_folder_is_counted_as_torch_writes_it(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    state = training_state()
    shards = {"state_dict": state["state_dict"], "optimizer_0": state["optimizer_0"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one process, no process group: DCP says so
        dcp.save(shards, checkpoint_id=tmp_path)
    data, index = dcp_part_bytes(shards, replicated=True)
    assert data == sum(p.stat().st_size for p in tmp_path.glob("*.distcp"))
    metadata = (tmp_path / ".metadata").stat().st_size
    assert metadata <= index <= 2 * metadata, (index, metadata)
    # the items counted are the ones DCP stores, one by one (the optimizer's groups too)
    stored = FileSystemReader(tmp_path).read_metadata().state_dict_metadata
    assert len(stored) > len(shards["state_dict"]) + 4 * 3


def test_values_every_rank_holds_are_counted_on_one_rank_only():
    state = {"weight": torch.ones(4), "lr": 0.1, "names": ["a", "b"]}
    on_rank_zero, elsewhere = dcp_part_bytes(state, replicated=True), dcp_part_bytes(state, replicated=False)
    assert elsewhere == (0, 0) and on_rank_zero[0] > 0


@pytest.mark.parametrize("value", [torch.zeros(3, dtype=torch.bfloat16), {"nested": [1, 2, 3]}, "text"])
def test_any_value_torch_saves_is_counted_exactly(value):
    written = io.BytesIO()
    torch.save(value, written)
    assert torch_save_bytes(value) == len(written.getvalue())
