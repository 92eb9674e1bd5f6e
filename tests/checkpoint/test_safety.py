"""framework.checkpoint.safety: the restricted readers refuse anything that could run code,
read what the libraries really write, and the proof covers every pickled file.

The DCP folder here is written in this process by torch.distributed.checkpoint itself
(``no_dist``); the 2-rank FSDP2 and DeepSpeed folders of real runs, given to every
command: tests/distributed/test_checkpoint_forms.py."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import pytest
import torch

from tests.helpers.battery import layerdrop, refusal
from framework.checkpoint import CheckpointError
from framework.checkpoint.safety import (LibraryObject, RestrictedUnpickler, load_dcp_metadata, load_torch_file,
                                     prove_checkpoint_harmless)


class WritesMarker:
    """Unpickling this calls open(marker, "w"): a file appears if the reader runs code."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.fixture
def dcp_folder(tmp_path) -> Path:
    """A DCP checkpoint as Lightning's ModelParallelStrategy lays it out: tensors and
    optimizer hyper-parameters (byte entries) through DCP, the rest in meta.pt."""
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "last.ckpt"
    state = {"state_dict": {"model.w": torch.randn(4, 3), "model.b": torch.zeros(3)},
             "optimizer_0": {"param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "name": "hidden"}]}}
    with pytest.warns(UserWarning):  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=folder, no_dist=True)
    torch.save({"global_step": 3, "layerdrop": {"format": 1}}, folder / "meta.pt")
    return folder


def test_the_metadata_torch_writes_is_read_unchanged(dcp_folder):
    metadata = load_dcp_metadata(dcp_folder / ".metadata")
    reference = pickle.loads((dcp_folder / ".metadata").read_bytes())
    assert metadata.state_dict_metadata == reference.state_dict_metadata
    assert metadata.storage_data == reference.storage_data and metadata.planner_data == reference.planner_data
    prove_checkpoint_harmless(dcp_folder)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_payload_is_refused_at_every_pickle_protocol(tmp_path, protocol):
    marker = tmp_path / "marker"
    data = pickle.dumps({"ok": [1, 2.0, "x"], "payload": WritesMarker(marker)}, protocol=protocol)
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        RestrictedUnpickler(io.BytesIO(data), {}).load()
    assert not marker.exists()
    clean = pickle.dumps({"ok": [1, 2.0, "x", (3, None)], "set": {1}}, protocol=protocol)
    assert RestrictedUnpickler(io.BytesIO(clean), {}).load() == {"ok": [1, 2.0, "x", (3, None)], "set": {1}}


def test_an_allowed_class_cannot_have_its_attributes_set(tmp_path):
    """BUILD on the class object itself (not an instance) would set class attributes:
    torch's weights-only rules refuse it, and so does the restricted unpickler."""
    from torch.distributed.checkpoint.metadata import Metadata

    # GLOBAL Metadata; state (None, {"injected": 1}); BUILD -> setattr(Metadata, "injected", 1)
    data = (b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n"
            b"N}X\x08\x00\x00\x00injectedK\x01s\x86b.")
    path = tmp_path / ".metadata"
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match="is refused: unpickling it could run code"):
        load_dcp_metadata(path)
    assert not hasattr(Metadata, "injected")


@pytest.mark.parametrize("opcode", [b"c__builtin__\nprint\n(S'x'\ntR.", b"(c__builtin__\nprint\nS'x'\no.",
                                    b"(i__builtin__\nprint\nS'x'\n."])
def test_opcodes_that_call_anything_are_refused(opcode):
    with pytest.raises(pickle.UnpicklingError):
        RestrictedUnpickler(io.BytesIO(opcode), {}).load()


@pytest.mark.parametrize("target", [".metadata", "meta.pt", "byte entry"])
def test_a_payload_in_any_pickled_file_of_a_dcp_folder_is_named(dcp_folder, target):
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    marker = dcp_folder.parent / "marker"
    metadata = pickle.loads((dcp_folder / ".metadata").read_bytes())
    if target == ".metadata":
        metadata.planner_data["x"] = WritesMarker(marker)
        named = dcp_folder / ".metadata"
    elif target == "meta.pt":
        torch.save({"global_step": 3, "x": WritesMarker(marker)}, dcp_folder / "meta.pt")
        named = dcp_folder / "meta.pt"
    else:  # the optimizer's lr entry, stored in the shard file as a torch.save'd object
        index = next(i for i in metadata.storage_data if isinstance(metadata.state_dict_metadata[i.fqn],
                                                                      BytesStorageMetadata))
        shard = dcp_folder / metadata.storage_data[index].relative_path
        blob = io.BytesIO()
        torch.save(WritesMarker(marker), blob)
        offset = shard.stat().st_size
        with open(shard, "ab") as handle:
            handle.write(blob.getvalue())
        metadata.storage_data[index] = _StorageInfo(shard.name, offset, len(blob.getvalue()))
        named = shard
    (dcp_folder / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match="is refused: unpickling it could run code") as err:
        prove_checkpoint_harmless(dcp_folder)
    assert str(named) in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()


def test_deepspeed_classes_are_read_as_inert_stand_ins(tmp_path):
    """DeepSpeed's state classes are allowed by name and mapped to stand-ins that run
    none of DeepSpeed's code: an enum member comes back as its value, the others as
    their fields."""
    deepspeed_classes = pytest.importorskip("deepspeed.runtime.zero.config")
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.utils.tensor_fragment import fragment_address

    path = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"zero_stage": deepspeed_classes.ZeroStageEnum.weights, "loss_scaler": LossScaler(1.0),
                "address": fragment_address(numel=6, start=2), "w": torch.ones(2)}, path)
    loaded = load_torch_file(path, deepspeed=True)
    assert all(isinstance(loaded[k], LibraryObject) for k in ("zero_stage", "loss_scaler", "address"))
    assert loaded["zero_stage"].value == 3 and vars(loaded["address"]) == {"numel": 6, "start": 2}
    with pytest.raises(CheckpointError, match="it names deepspeed"):
        load_torch_file(path)  # outside a DeepSpeed folder the names are not allowed


def test_the_proof_walks_linked_folders_once_and_refuses_escaping_tags(tmp_path):
    folder = tmp_path / "ckpt"
    (folder / "checkpoint").mkdir(parents=True)
    torch.save({"module": {}}, folder / "checkpoint" / "mp_rank_00_model_states.pt")
    os.symlink(folder, folder / "checkpoint" / "loop")  # a cycle: must still end
    (folder / "latest").write_text("checkpoint")
    prove_checkpoint_harmless(folder)
    torch.save({"x": WritesMarker(tmp_path / "marker")}, tmp_path / "outside.pt")
    (folder / "latest").write_text("../outside")
    with pytest.raises(CheckpointError, match="latest' is refused: its tag '../outside'"):
        prove_checkpoint_harmless(folder)
    assert not (tmp_path / "marker").exists()


class CallsSystem:
    def __reduce__(self):
        return os.system, ("true",)


def test_a_refusal_names_what_the_pickle_calls_and_never_advises_weights_only_false(tmp_path):
    """torch's own message starts by advising weights_only=False: the one thing that would run it."""
    torch.save({"state_dict": {}, "x": CallsSystem()}, tmp_path / "evil.ckpt")
    line = refusal(layerdrop("export", "--ckpt", tmp_path / "evil.ckpt", "--out", tmp_path / "out"))
    assert "evil.ckpt' is refused: unpickling it could run code (it names posix.system, which is not allowed)" in line
    assert "weights_only" not in line
