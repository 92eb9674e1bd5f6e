"""Exit adapters: initialisation, the exits allowed, and their files."""

from __future__ import annotations

import pytest
import torch

from eval.adapters.exit_adapters import ExitAdapters, check_exits, default_exits, load_adapters, save_adapters
from framework.checkpoint import CheckpointError
from framework.config import ModelConfig
from framework.model.decoder import Decoder
from tests.eval.adapters.backbones import SEQ_LEN, random_backbone
from tests.helpers.hostile_files import deep_json


def test_last_block_init_copies_and_random_init_does_not():
    backbone = random_backbone()
    last = ExitAdapters(backbone.config, [1, 3])
    last.initialise(backbone, "last")
    for block in last.blocks.values():
        for key, value in backbone.blocks[-1].state_dict().items():
            assert torch.equal(block.state_dict()[key], value)
    fresh = ExitAdapters(backbone.config, [2])
    fresh.initialise(backbone, "random")
    assert not torch.equal(fresh.blocks["2"].ffn.up.weight, backbone.blocks[-1].ffn.up.weight)
    with pytest.raises(ValueError, match="init='copy' is invalid"):
        fresh.initialise(backbone, "copy")


@pytest.mark.parametrize("exits", [[0], [4], [1, 7], [], [2.5]])
def test_exits_outside_one_to_l_minus_one_are_refused(exits):
    with pytest.raises(ValueError, match=r"exits=.* is invalid: .* in 1\.\.3"):
        check_exits(exits, 4)


def test_default_exits():
    assert default_exits(4) == [1, 2, 3]
    assert default_exits(13) == [3, 6, 10]
    assert default_exits(2) == [1]


def test_adapter_files_round_trip_and_refuse_another_shape(tmp_path):
    backbone = random_backbone()
    adapters = ExitAdapters(backbone.config, [2])
    adapters.initialise(backbone, "random")
    save_adapters(adapters, tmp_path / "a", {"backbone": "x", "model": backbone.config.to_dict()})
    loaded, meta = load_adapters(tmp_path / "a", backbone)
    assert meta["exits"] == [2]
    assert torch.equal(loaded.blocks["2"].attn.qkv.weight, adapters.blocks["2"].attn.qkv.weight)
    with pytest.raises(FileExistsError, match="--overwrite"):
        save_adapters(adapters, tmp_path / "a", {"model": backbone.config.to_dict()})
    other = Decoder(ModelConfig(vocab_size=97, d_model=32, n_layers=4, n_heads=2, max_seq_len=SEQ_LEN))
    with pytest.raises(CheckpointError, match="another model shape"):
        load_adapters(tmp_path / "a", other)


@pytest.mark.parametrize("meta, message", [
    ('{"exits": ' + deep_json(5_000) + "}", "adapters.json is refused: it is nested more than 100 levels deep"),
    ("{not json", "adapters.json is not valid JSON"),
    ("[2]", 'adapters.json is invalid: expected an object with a list of "exits"'),
])
def test_a_broken_adapters_json_is_a_checkpoint_error_naming_it(tmp_path, meta, message):
    """Issue 46: read with a bare json.loads, these were tracebacks (RecursionError, JSONDecodeError, TypeError)."""
    backbone = random_backbone()
    adapters = ExitAdapters(backbone.config, [2])
    save_adapters(adapters, tmp_path / "a", {"backbone": "x", "model": backbone.config.to_dict()})
    (tmp_path / "a" / "adapters.json").write_text(meta)
    with pytest.raises(CheckpointError, match=f"^adapters folder '{tmp_path / 'a'}': {message}"):
        load_adapters(tmp_path / "a", backbone)
