"""The Hugging Face folder form: read (safetensors only, sharded or not, refusals in
one line naming the field) and written by ``layerdrop export --format hf`` so that
transformers loads it back with the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from framework.checkpoint import Checkpoint, CheckpointError, checkpoint_form, export_decoder, load_decoder
from framework.config import ModelConfig
from framework.checkpoint.export import main as export_main
from framework.model.decoder import Decoder
from tests.helpers.hf_llama import LLAMA3_ROPE, VOCAB, tiny_hf_llama

TOKENS = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))


@pytest.fixture
def hf_dir(tmp_path):
    tiny_hf_llama(tmp_path / "hf", tie=True, rope_scaling=LLAMA3_ROPE)
    return tmp_path / "hf"


def edit_config(folder: Path, **changes) -> None:
    file = folder / "config.json"
    config = json.loads(file.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    file.write_text(json.dumps(config))


def test_an_hf_folder_is_its_own_form(hf_dir):
    assert checkpoint_form(hf_dir) == "hf"
    (hf_dir / "tokenizer.json").write_text("{}")
    assert Checkpoint.open(hf_dir).find_tokenizer() == (hf_dir / "tokenizer.json").resolve()


@pytest.mark.parametrize("changes, message", [
    ({"architectures": ["MistralForCausalLM"]}, "architectures=['MistralForCausalLM'] is not supported"),
    ({"model_type": "gpt_neox"}, "model_type='gpt_neox' is not supported: allowed: .*'llama', "),
    ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported: allowed: 'silu'"),
    ({"attention_bias": True}, "attention_bias=True is not supported"),
    ({"sliding_window": 4096}, "sliding_window=4096 is not supported: a field layerdrop does not know"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}, "rope_parameters": None},
     r"rope_scaling.rope_type='yarn' is not supported: allowed: 'default', 'llama3'"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
     r"rope_parameters.rope_type='linear' is not supported"),
    ({"num_hidden_layers": None}, "the field 'num_hidden_layers' is missing"),
])
def test_what_would_change_the_function_is_refused_naming_the_field(hf_dir, changes, message):
    edit_config(hf_dir, **changes)
    with pytest.raises(CheckpointError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
        load_decoder(hf_dir)
    assert "\n" not in str(err.value)


def test_a_folder_of_pickled_weights_only_is_refused_without_unpickling(hf_dir):
    (hf_dir / "model.safetensors").unlink()
    # Not even a valid pickle: it is never opened.
    (hf_dir / "pytorch_model.bin").write_bytes(b"\x80\x04 would run code")
    with pytest.raises(CheckpointError, match="holds only pickled weights \\(pytorch_model.bin\\): layerdrop "
                                              "reads safetensors only"):
        load_decoder(hf_dir)


def test_an_index_naming_a_shard_outside_the_folder_is_refused(tmp_path):
    tiny_hf_llama(tmp_path / "hf", shard=True)
    index = tmp_path / "hf" / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    first = next(iter(data["weight_map"]))
    data["weight_map"][first] = "../elsewhere.safetensors"
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="names the shard '../elsewhere.safetensors' outside the folder"):
        load_decoder(tmp_path / "hf")


def test_tensors_the_family_does_not_have_are_refused(hf_dir):
    from safetensors.torch import load_file, save_file

    tensors = load_file(hf_dir / "model.safetensors")
    tensors["model.layers.0.self_attn.q_norm.weight"] = torch.ones(16)
    save_file(tensors, hf_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"unexpected \['model.layers.0.self_attn.q_norm.weight'\]"):
        load_decoder(hf_dir)


@pytest.mark.parametrize("shape", [{"tie": True, "rope_scaling": LLAMA3_ROPE}, {"kv_heads": 1}], ids=["tied", "mqa"])
def test_export_format_hf_round_trips_through_from_pretrained(tmp_path, shape):
    original = tiny_hf_llama(tmp_path / "hf", **shape)
    assert export_main(["--ckpt", str(tmp_path / "hf"), "--out", str(tmp_path / "out"), "--format", "hf",
                        "--no-tokenizer"]) == 0
    assert {"model.safetensors", "config.json", "generation_config.json"} <= {p.name for p in (tmp_path / "out").iterdir()}
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert isinstance(back, LlamaForCausalLM)
    with torch.no_grad():
        assert (back(TOKENS).logits - original(TOKENS).logits).abs().max() <= 1e-5


def test_a_layerdrop_export_of_a_llama_exports_to_hf_with_its_tokenizer(tmp_path, prepared_tokens):
    tiny_hf_llama(tmp_path / "hf", vocab=300)
    decoder, _ = load_decoder(tmp_path / "hf")
    export_decoder(decoder, tmp_path / "ours", tokenizer=prepared_tokens / "tokenizer.json",
                   extra={"tokenizer": {"file": "tokenizer.json", "eos_id": 0}})
    assert export_main(["--ckpt", str(tmp_path / "ours"), "--out", str(tmp_path / "out"), "--format", "hf"]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["eos_token_id"] == 0 and (tmp_path / "out" / "tokenizer.json").is_file()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tokenizer.eos_token_id == 0 and tokenizer("def f():")["input_ids"]
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        assert (back(TOKENS).logits - decoder(TOKENS)).abs().max() <= 1e-5


def test_a_celerity_model_is_refused_by_format_hf_in_one_line(tmp_path, capsys):
    export_decoder(Decoder(ModelConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2)), tmp_path / "celerity")
    assert export_main(["--ckpt", str(tmp_path / "celerity"), "--out", str(tmp_path / "out"), "--format", "hf",
                        "--no-tokenizer"]) == 2
    err = capsys.readouterr().err.strip()
    assert "family='celerity' has no transformers class" in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_export_format_hf_does_not_overwrite_unless_asked(tmp_path, hf_dir):
    args = ["--ckpt", str(hf_dir), "--out", str(tmp_path / "out"), "--format", "hf", "--no-tokenizer"]
    assert export_main(args) == 0
    assert export_main(args) == 2
    assert export_main([*args, "--overwrite"]) == 0


# ------------------------------------------------------------------ checked before anything is built


def refused(folder: Path, match: str) -> str:
    """The one-line CheckpointError of reading the folder's config (what init_from does
    first) and of loading it."""
    from framework.checkpoint import read_model_config

    for read in (read_model_config, load_decoder):
        with pytest.raises(CheckpointError, match=match) as err:
            read(folder)
        assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("field, value", [("hidden_size", 10**7), ("intermediate_size", 10**10),
                                          ("vocab_size", 10**12), ("num_hidden_layers", 10**6),
                                          ("num_attention_heads", 10**6), ("num_key_value_heads", 1)])
def test_config_sizes_are_checked_against_the_safetensors_headers(hf_dir, field, value):
    """Absurd (or merely wrong) sizes: the project's own one-line refusal, from the headers,
    before anything is allocated (these ended in allocator tracebacks or ran for minutes)."""
    edit_config(hf_dir, **{field: value})
    refused(hf_dir, "does not match its config")


@pytest.mark.parametrize("changes, message", [
    ({"hidden_size": 1e7}, "hidden_size=10000000.0 is not supported: allowed: a positive integer"),
    ({"num_key_value_heads": "2"}, "num_key_value_heads='2' is not supported: allowed: a positive integer"),
    ({"architectures": 5}, "architectures=5 is not supported"),
    ({"model_type": ["llama"]}, r"model_type=\['llama'\] is not supported"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
      "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling=.* conflicts with rope_parameters"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "rope_theta": 500000.0},
     "rope_theta=500000.0 is not supported: it conflicts with rope_parameters.rope_theta=10000.0"),
    ({"rope_interleaved": True}, "rope_interleaved=True is not supported: allowed: False"),
])
def test_a_malformed_or_conflicting_config_is_refused_naming_the_key(tmp_path, changes, message):
    tiny_hf_llama(tmp_path / "hf")
    edit_config(tmp_path / "hf", **{"rope_scaling": None, **changes})
    refused(tmp_path / "hf", message)


@pytest.mark.parametrize("key, value", [("eos_token_id", {"x": 1}), ("bos_token_id", "1"), ("pad_token_id", 1.0),
                                        ("eos_token_id", []), ("eos_token_id", [1, [2]]), ("bos_token_id", True)])
def test_token_ids_that_are_not_ids_are_refused_before_an_export_copies_them(tmp_path, key, value):
    """Issue 46, decided: ``eos_token_id: {"x": 1}`` was read and copied into the export's
    config.json. A token id is an integer, a non-empty list of them, or null; the rest is refused."""
    tiny_hf_llama(tmp_path / "hf")
    edit_config(tmp_path / "hf", **{key: value})
    refused(tmp_path / "hf", rf"config.json: {key}=.* is invalid: a token id, a non-empty list of token ids")
    code = export_main(["--ckpt", str(tmp_path / "hf"), "--out", str(tmp_path / "export")])
    assert code == 2 and not (tmp_path / "export").exists()
    for ok in (None, 2, [2, 3]):
        edit_config(tmp_path / "hf", **{key: ok})
        load_decoder(tmp_path / "hf")


@pytest.mark.parametrize("weight_map, message", [
    ([1, 2], r"weight_map=\[1, 2\], allowed: an object"), (5, "weight_map=5, allowed: an object"),
    ({"model.norm.weight": {"nested": "model.safetensors"}}, r"weight_map\['model.norm.weight'\]=\{'nested'"),
])
def test_a_malformed_index_is_refused_naming_the_key(tmp_path, weight_map, message):
    tiny_hf_llama(tmp_path / "hf", shard=True)
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    refused(tmp_path / "hf", message)


def test_integer_weights_are_refused_not_cast(hf_dir):
    from safetensors.torch import load_file, save_file

    tensors = load_file(hf_dir / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.int8)
    save_file(tensors, hf_dir / "model.safetensors", metadata={"format": "pt"})
    refused(hf_dir, "'model.norm.weight' is I8: layerdrop reads float weights only")


def test_shards_linked_into_the_models_own_blob_store_are_accepted(tmp_path):
    """The Hugging Face cache layout: snapshots/<revision>/<shard> -> ../../blobs/<hash>."""
    original = tiny_hf_llama(tmp_path / "plain", shard=True)
    model = tmp_path / "hub" / "models--org--tiny"
    snapshot, blobs = model / "snapshots" / "abc123", model / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for n, file in enumerate(sorted((tmp_path / "plain").iterdir())):
        file.rename(blobs / f"blob{n}")
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", f"blob{n}"))
    decoder, _ = load_decoder(snapshot)
    with torch.no_grad():
        assert (decoder(TOKENS) - original(TOKENS).logits).abs().max() <= 1e-5
    # A link anywhere else is still outside the folder.
    shard = next(p for p in snapshot.iterdir() if p.name.startswith("model-"))
    target = shard.resolve()
    shard.unlink()
    (tmp_path / "elsewhere").mkdir()
    target.rename(tmp_path / "elsewhere" / "blob")
    shard.symlink_to(tmp_path / "elsewhere" / "blob")
    refused(snapshot, f"names the shard '{shard.name}' outside the folder")


def test_an_unknown_fields_value_is_shortened_in_the_error(hf_dir):
    edit_config(hf_dir, huge_field="x" * 1_000_000)
    message = refused(hf_dir, r"huge_field='xxx.*\.\.\. \(1000002 characters\) is not supported")
    assert len(message) < 1000


def test_known_harmless_fields_are_accepted(hf_dir):
    """SmolLM2's config marks itself ``is_llama_config`` and says ``rope_interleaved: false``
    (the halves layout, which is Llama's)."""
    edit_config(hf_dir, is_llama_config=True, rope_interleaved=False)
    decoder, cfg = load_decoder(hf_dir)
    assert cfg.family == "llama"
