"""framework.checkpoint on single-file checkpoints and exports: round trips, clear
refusals (foreign files, mismatched weights, NaN weights), and no code execution.
The sharded forms of real multi-rank runs: tests/distributed/test_checkpoint_forms.py."""

from __future__ import annotations

import json
import re

import pytest
import torch

from framework.checkpoint import (FORMS, CheckpointError, checkpoint_form, export_decoder, load_decoder, read_metadata,
                                  read_model_config)
from framework.config import ModelConfig
from framework.model.decoder import Decoder
from tests.helpers.battery import hashes, layerdrop, refusal


def make_decoder(**overrides) -> Decoder:
    torch.manual_seed(0)
    cfg = ModelConfig(**{"vocab_size": 71, "d_model": 30, "n_layers": 2, "n_heads": 3,
                         "max_seq_len": 16, "logit_multiplier": 0.5, **overrides})
    return Decoder(cfg)


def lightning_checkpoint(decoder: Decoder, **extra) -> dict:
    """The layout `layerdrop pretrain` writes: weights under model.*, the config as a dict."""
    return {"state_dict": {f"model.{k}": v for k, v in decoder.state_dict().items()},
            "layerdrop": {"model_config": decoder.config.to_dict()}, "global_step": 3, **extra}


def assert_same_function(a: Decoder, b: Decoder) -> None:
    tokens = torch.randint(0, a.config.vocab_size, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(a(tokens), b(tokens), rtol=0, atol=0)


def test_export_then_load_round_trip(tmp_path):
    decoder = make_decoder()
    out = export_decoder(decoder, tmp_path / "export", extra={"training": {"global_step": 3}})
    # the marker says this project wrote the folder (an --overwrite may replace it: framework/checkpoint/export.py)
    assert sorted(p.name for p in out.iterdir()) == [".layerdrop-export", "config.json", "model.safetensors"]
    assert json.loads((out / "config.json").read_text())["training"] == {"global_step": 3}
    assert checkpoint_form(out) == "exported"
    loaded, cfg = load_decoder(out)
    assert cfg == decoder.config and not loaded.training
    assert_same_function(loaded, decoder.eval())
    assert read_model_config(out) == decoder.config


def test_export_refuses_to_overwrite_unless_asked(tmp_path):
    first, second = make_decoder(), make_decoder(init_std=0.05)
    export_decoder(first, tmp_path)
    with pytest.raises(CheckpointError, match="already holds model.safetensors; pass --overwrite"):
        export_decoder(second, tmp_path)
    assert_same_function(load_decoder(tmp_path)[0], first.eval())
    export_decoder(second, tmp_path, overwrite=True)
    assert_same_function(load_decoder(tmp_path)[0], second.eval())


def test_lightning_checkpoint_round_trip(tmp_path):
    decoder = make_decoder()
    path = tmp_path / "last.ckpt"
    torch.save(lightning_checkpoint(decoder, optimizer_states=[{"step": torch.tensor(3)}]), path)
    loaded, cfg = load_decoder(path)
    assert cfg == decoder.config and checkpoint_form(path) == "lightning"
    assert_same_function(loaded, decoder.eval())
    assert read_model_config(path) == decoder.config
    metadata = read_metadata(path)
    assert metadata["global_step"] == 3 and "state_dict" not in metadata and "optimizer_states" not in metadata


class WritesMarker:
    """Unpickling this calls open(marker, "w"): a file appears if the loader runs code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_malicious_pickle_is_refused_and_runs_no_code(tmp_path):
    decoder = make_decoder()
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.ckpt"
    torch.save(lightning_checkpoint(decoder, callbacks=WritesMarker(marker)), path)
    for read in (load_decoder, read_model_config, read_metadata):
        with pytest.raises(CheckpointError, match="evil.ckpt' is refused: unpickling it could run code") as err:
            read(path)
        assert "\n" not in str(err.value) and not marker.exists()
    # The payload is real: an unsafe load of a twin file does run it.
    control_marker = tmp_path / "control"
    control = tmp_path / "control.ckpt"
    torch.save({"x": WritesMarker(control_marker)}, control)
    torch.load(control, weights_only=False)
    assert control_marker.exists()


def test_missing_and_foreign_paths_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_decoder(tmp_path / "nope.ckpt")
    described = [re.escape(form.described) for form in FORMS]  # every form is named, whatever the registry holds
    with pytest.raises(CheckpointError, match="is not a checkpoint: expected " + ", ".join(described[:-1])):
        load_decoder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model": make_decoder().config.to_dict()}))
    with pytest.raises(CheckpointError, match="has no model.safetensors"):
        load_decoder(tmp_path)
    torch.save({"state_dict": {}}, tmp_path / "plain.ckpt")
    with pytest.raises(CheckpointError, match="is not a layerdrop checkpoint"):
        load_decoder(tmp_path / "plain.ckpt")
    (tmp_path / "garbage.ckpt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="garbage.ckpt' is refused: it is not a pickle torch.save writes"):
        load_decoder(tmp_path / "garbage.ckpt")


def test_invalid_config_or_mismatched_weights_are_refused(tmp_path):
    decoder = make_decoder()
    out = export_decoder(decoder, tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    config["model"]["n_layers"] = 0
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="n_layers=0 is invalid"):
        load_decoder(out)
    config["model"]["n_layers"] = 3  # a valid config, but the weights have 2 layers
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="does not match its config: missing \\['blocks.2"):
        load_decoder(out)
    (out / "config.json").write_text(json.dumps({"weights": {}}))
    with pytest.raises(CheckpointError, match="config has no 'model' section"):
        load_decoder(out)


def test_weights_of_another_shape_are_refused_by_name(tmp_path):
    decoder = make_decoder()
    state = lightning_checkpoint(decoder)
    state["state_dict"]["model.head.weight"] = torch.zeros(5, 30)
    torch.save(state, tmp_path / "bad.ckpt")
    with pytest.raises(CheckpointError, match=r"head.weight has shape \[5, 30\] in the checkpoint, \[71, 30\]"):
        load_decoder(tmp_path / "bad.ckpt")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_in_one_line(tmp_path, value):
    """A diverged run's checkpoint would print NaN for every metric and exit 0."""
    decoder = make_decoder()
    with torch.no_grad():
        decoder.blocks[1].ffn.up.weight[0, 0] = value
    path = tmp_path / "diverged.ckpt"
    torch.save(lightning_checkpoint(decoder), path)
    with pytest.raises(CheckpointError, match="holds non-finite weights \\(1 tensors, the first "
                                              "blocks.1.ffn.up.weight\\)") as err:
        load_decoder(path)
    assert "\n" not in str(err.value)
    export = export_decoder(decoder, tmp_path / "export")
    with pytest.raises(CheckpointError, match="non-finite"):
        load_decoder(export)


def test_an_opened_ckpt_file_is_read_once_whatever_is_asked(tmp_path, monkeypatch):
    """The proof, the metadata, the shapes checked against the config, the tokenizer
    record and the weights all come from one weights-only load of the file."""
    import framework.checkpoint.lightning_file as lightning_file
    from framework.checkpoint import Checkpoint

    decoder = make_decoder()
    path = tmp_path / "last.ckpt"
    torch.save(lightning_checkpoint(decoder), path)
    loads = []
    monkeypatch.setattr(lightning_file, "load_torch_file", lambda p: loads.append(p) or torch.load(
        p, map_location="cpu", weights_only=True, mmap=True))
    ckpt = Checkpoint.open(path)
    assert ckpt.model_config == decoder.config and ckpt.tokenizer_record() == {}
    loaded, _ = ckpt.load_decoder()
    assert sorted(name for name, _ in ckpt.tensors()) == sorted(decoder.state_dict())
    assert_same_function(loaded, decoder.eval())
    assert loads == [path]


def test_copy_into_fills_a_compiled_and_checkpoint_wrapped_decoder(tmp_path):
    """The one way weights enter a decoder: a training run's (model.init_from), whose names
    carry the wrappers' segments, gets the checkpoint's tensors by their plain names."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from framework.checkpoint import Checkpoint
    from framework.checkpoint.base import copy_into

    source = make_decoder()
    path = tmp_path / "last.ckpt"
    torch.save(lightning_checkpoint(source), path)
    target = make_decoder(init_std=0.5)
    target.blocks[0] = checkpoint_wrapper(target.blocks[0])
    target.blocks[1] = torch.compile(target.blocks[1])  # compiles lazily: nothing runs here
    copy_into(target, Checkpoint.open(path).tensors(), path)
    assert "blocks.1._orig_mod.attn.qkv.weight" in target.state_dict()
    assert torch.equal(target.blocks[1].attn.qkv.weight, source.blocks[1].attn.qkv.weight)
    assert torch.equal(target.blocks[0].ffn.down.weight, source.blocks[0].ffn.down.weight)
    with torch.no_grad():
        source.blocks[0].attn_norm.weight[0] = float("nan")
    torch.save(lightning_checkpoint(source), path)
    with pytest.raises(CheckpointError, match="holds non-finite weights \\(1 tensors, the first blocks.0.attn_norm"):
        copy_into(target, Checkpoint.open(path).tensors(), path)


def test_loading_copies_into_the_decoder_one_tensor_at_a_time(tmp_path):
    """No second full copy of the weights: the file is memory-mapped and each tensor is
    copied into the decoder's own storage (the loaded tensors are not the file's)."""
    decoder = make_decoder()
    path = tmp_path / "last.ckpt"
    torch.save(lightning_checkpoint(decoder), path)
    loaded, _ = load_decoder(path)
    pointers = {t.untyped_storage().data_ptr() for t in loaded.state_dict().values()}
    assert len(pointers) == len(loaded.state_dict())


# ------------------------------------------------------------------ a careless or hostile config.json (issue 23)


@pytest.mark.parametrize("change, message", [
    ({"n_layers": 100_000}, "missing ['blocks.2."),  # once: minutes and GBs building 10^5 blocks
    ({"n_layers": 10_000_000}, "missing ['blocks.2."),  # once: grew until the OOM killer came
    ({"d_model": 10_000_000}, "embed.weight has shape [71, 30] in the checkpoint, [71, 10000000] in the model"),
    ({"vocab_size": 10 ** 12}, "embed.weight has shape [71, 30] in the checkpoint, [1000000000000, 30]"),
    ({"n_heads": 1_000_000, "n_kv_heads": 1_000_000, "head_dim": 1}, "has shape [90, 30] in the checkpoint, [3000000, 30] in the model"),
])
def test_a_config_is_checked_against_the_weights_before_a_model_is_built(tmp_path, change, message):
    out = export_decoder(make_decoder(), tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    config["model"].update(change)
    (out / "config.json").write_text(json.dumps(config))
    before = hashes(out)
    line = refusal(layerdrop("export", "--ckpt", out, "--out", tmp_path / "copy", "--no-tokenizer", timeout=120))
    assert "does not match its config" in line and message in line
    assert hashes(out) == before and not (tmp_path / "copy").exists()


def test_a_deeply_nested_config_is_one_line(tmp_path):
    out = export_decoder(make_decoder(), tmp_path / "export")
    (out / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    line = refusal(layerdrop("export", "--ckpt", out, "--out", tmp_path / "copy", "--no-tokenizer"))
    assert "config.json' is not valid JSON: nested too deeply" in line


def test_every_form_answers_every_question_of_the_protocol():
    """The loader asks each form for its shapes and tensors; a form that cannot says so
    itself (None, or a one-line refusal) instead of lacking the member."""
    members = ("detect", "incomplete_reason", "prove_harmless", "open", "metadata", "model_config", "load_into",
               "shapes", "tensors")
    lacking = [f"{form.name}.{m}" for form in FORMS for m in members if not callable(getattr(type(form), m, None))]
    assert lacking == []
