"""framework.checkpoint.export: `layerdrop export` on a real single-device run, the export every
run writes at its end, and the streaming safetensors writer (read back by the
safetensors library). Exports of FSDP2 and DeepSpeed folders:
tests/distributed/test_checkpoint_forms.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from framework.checkpoint import CheckpointError, load_decoder
from framework.checkpoint.tokenizer_record import sha256_of
from framework.checkpoint.safetensors_writer import SafetensorsWriter
from framework.checkpoint.export import MARKER, main as export_main
from tests.helpers.battery import hashes, layerdrop, refusal
from tests.helpers.checkpoint_run import moved_copy, pretrained_run


@pytest.fixture(scope="module")
def run_root(shared_dir, prepared_tokens):
    return pretrained_run(shared_dir, prepared_tokens)


@pytest.fixture(scope="module")
def checkpoint(run_root):
    return run_root / "run" / "checkpoints" / "last.ckpt"


def visible(folder: Path) -> list[str]:
    """What an export holds besides its marker (the hidden file saying layerdrop wrote it)."""
    return sorted(p.name for p in folder.iterdir() if p.name != MARKER)


def same_function(a, b) -> None:
    tokens = torch.randint(0, a.config.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(a(tokens), b(tokens), rtol=0, atol=0)


def test_export_writes_the_same_function_and_the_tokenizer(checkpoint, run_root, tmp_path, capsys):
    out = tmp_path / "export"
    assert export_main(["--ckpt", str(checkpoint), "--out", str(out)]) == 0
    assert visible(out) == ["config.json", "model.safetensors", "tokenizer.json"]
    config = json.loads((out / "config.json").read_text())
    assert config["training"]["global_step"] == 2 and config["training"]["layer_dropout"]["p_max"] == 0.4
    tokenizer = config["tokenizer"]
    assert tokenizer["file"] == "tokenizer.json" and tokenizer["sha256"] == sha256_of(out / "tokenizer.json")
    assert (out / "tokenizer.json").read_bytes() == (run_root / "data" / "tokenizer.json").read_bytes()
    manifest = json.loads((run_root / "data" / "manifest.json").read_text())["tokenizer"]
    assert tokenizer["eos_id"] == manifest["eos_id"]
    trained, _ = load_decoder(checkpoint)
    exported, cfg = load_decoder(out)
    assert cfg == trained.config
    same_function(exported, trained)
    assert "exported" in capsys.readouterr().out


def test_every_run_ends_with_an_export_of_its_final_model(checkpoint, run_root):
    out = run_root / "run" / "export"
    assert visible(out) == ["config.json", "model.safetensors", "tokenizer.json"]
    config = json.loads((out / "config.json").read_text())
    assert config["training"]["global_step"] == 2
    assert config["tokenizer"]["sha256"] == sha256_of(out / "tokenizer.json")
    same_function(load_decoder(out)[0], load_decoder(checkpoint)[0])
    assert not list((run_root / "run").glob(".export*"))  # no staging left behind


def test_export_refuses_to_overwrite_unless_asked(checkpoint, tmp_path, capsys):
    out = tmp_path / "export"
    assert export_main(["--ckpt", str(checkpoint), "--out", str(out)]) == 0
    before = (out / "model.safetensors").read_bytes()
    assert export_main(["--ckpt", str(checkpoint), "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("pass --overwrite to replace it")
    assert (out / "model.safetensors").read_bytes() == before
    assert export_main(["--ckpt", str(checkpoint), "--out", str(out), "--overwrite"]) == 0


def test_errors_are_one_line(tmp_path, capsys):
    assert export_main(["--ckpt", str(tmp_path / "nope.ckpt"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: checkpoint" in err and not (tmp_path / "x").exists()


def test_without_a_tokenizer_the_export_stops_unless_told(checkpoint, tmp_path, capsys):
    lone = moved_copy(checkpoint, tmp_path / "lone.ckpt", tmp_path / "gone")  # its data folder is gone
    assert export_main(["--ckpt", str(lone), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no tokenizer found" in err and "--no-tokenizer" in err
    assert not (tmp_path / "a").exists()
    assert export_main(["--ckpt", str(lone), "--out", str(tmp_path / "b"), "--no-tokenizer"]) == 0
    assert visible(tmp_path / "b") == ["config.json", "model.safetensors"]
    assert "tokenizer" not in json.loads((tmp_path / "b" / "config.json").read_text())
    kept = checkpoint.parent / "tokenizer.json"
    assert export_main(["--ckpt", str(lone), "--out", str(tmp_path / "c"), "--tokenizer", str(kept)]) == 0
    assert (tmp_path / "c" / "tokenizer.json").read_bytes() == kept.read_bytes()


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path, capsys):
    class Payload:
        def __reduce__(self):
            return (exec, ("open(%r, 'w').write('pwned')" % str(tmp_path / "pwned"),))

    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "layerdrop": {"model_config": {}}, "x": Payload()}, path)
    assert export_main(["--ckpt", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "evil.ckpt' is refused: unpickling it could run code (it names exec" in err
    assert not (tmp_path / "pwned").exists()


def test_re_exporting_an_export_keeps_its_record(checkpoint, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    assert export_main(["--ckpt", str(checkpoint), "--out", str(first)]) == 0
    assert export_main(["--ckpt", str(first), "--out", str(second)]) == 0
    assert json.loads((second / "config.json").read_text()) == json.loads((first / "config.json").read_text())
    assert (second / "tokenizer.json").read_bytes() == (first / "tokenizer.json").read_bytes()


# ------------------------------------------------------------------ the writer


def test_the_streaming_writer_writes_what_the_library_reads(tmp_path):
    tensors = {"a.f32": torch.randn(3, 5), "b.bf16": torch.randn(7).to(torch.bfloat16),
               "c.f16": torch.randn(2, 2).half(), "d.i64": torch.arange(4), "e.bool": torch.tensor([True, False]),
               "f.scalar": torch.tensor(2.5), "g.empty": torch.zeros(0, 3), "h.u8": torch.tensor([1, 255],
                                                                                                dtype=torch.uint8)}
    path = tmp_path / "model.safetensors"
    with SafetensorsWriter(path, [(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()]) as writer:
        for name, tensor in tensors.items():
            writer.write(name, tensor)
    loaded = load_file(str(path))
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0)


def test_the_writer_refuses_out_of_order_or_missing_tensors_and_leaves_nothing(tmp_path):
    specs = [("a", torch.float32, (2,)), ("b", torch.float32, (3,))]
    path = tmp_path / "model.safetensors"
    with pytest.raises(CheckpointError, match="got b torch.float32 \\[3\\], expected a"):
        with SafetensorsWriter(path, specs) as writer:
            writer.write("b", torch.zeros(3))
    with pytest.raises(CheckpointError, match="1 tensors were not written"):
        with SafetensorsWriter(path, specs) as writer:
            writer.write("a", torch.zeros(2))
    assert list(tmp_path.iterdir()) == []
    with SafetensorsWriter(path, specs) as writer:  # a non-contiguous view is written as its values
        writer.write("a", torch.arange(4.0)[::2])
        writer.write("b", torch.ones(3))
    torch.testing.assert_close(load_file(str(path))["a"], torch.tensor([0.0, 2.0]))


# ------------------------------------------------------------------ what --out may be (issue 23)


def test_a_folder_that_is_not_an_export_is_never_written_into(checkpoint, run_root, tmp_path):
    """`cp -r data data_copy; export --out data_copy --no-tokenizer` once deleted the copy's tokenizer."""
    data = tmp_path / "data_copy"
    shutil.copytree(run_root / "data", data)
    before = hashes(data)
    for overwrite in ([], ["--overwrite"]):
        line = refusal(layerdrop("export", "--ckpt", checkpoint, "--out", data, "--no-tokenizer", *overwrite))
        assert "is a folder that is not an export" in line and "manifest.json" in line
    (tmp_path / "notes.txt").write_text("mine")
    line = refusal(layerdrop("export", "--ckpt", checkpoint, "--out", tmp_path / "notes.txt"))
    assert "is a file" in line
    assert hashes(data) == before and (tmp_path / "notes.txt").read_text() == "mine"


def test_overwrite_replaces_an_export_whole(checkpoint, tmp_path, capsys):
    out = tmp_path / "export"
    assert export_main(["--ckpt", str(checkpoint), "--out", str(out)]) == 0
    assert export_main(["--ckpt", str(checkpoint), "--out", str(out), "--overwrite", "--no-tokenizer"]) == 0
    assert visible(out) == ["config.json", "model.safetensors"]  # no stale tokenizer
    assert not list(tmp_path.glob(".export*"))


def test_an_interrupted_replacement_is_finished_before_anything_else(checkpoint, tmp_path, capsys):
    """Killed between the two renames: the old export aside, the new one complete, no export."""
    out = tmp_path / "export"
    assert export_main(["--ckpt", str(checkpoint), "--out", str(tmp_path / "new"), "--no-tokenizer"]) == 0
    assert export_main(["--ckpt", str(checkpoint), "--out", str(out)]) == 0
    new = hashes(tmp_path / "new")
    out.rename(tmp_path / ".export.replaced")
    (tmp_path / "new").rename(tmp_path / ".export.staging")
    line = refusal(layerdrop("export", "--ckpt", checkpoint, "--out", out))
    assert "already holds model.safetensors; pass --overwrite" in line
    assert {Path(k).name: v for k, v in hashes(out).items()} == {Path(k).name: v for k, v in new.items()}
    assert not list(tmp_path.glob(".export*"))


def test_the_tokenizer_hint_comes_only_with_a_tokenizer_error(tmp_path):
    for ckpt in (tmp_path / "nope.ckpt", tmp_path):  # missing; not a checkpoint
        line = refusal(layerdrop("export", "--ckpt", ckpt, "--out", tmp_path / "out"))
        assert "--no-tokenizer" not in line and "--tokenizer" not in line
    assert not (tmp_path / "out").exists()


def test_an_hf_folder_with_an_eos_list_exports_to_hf_whole(tmp_path, capsys):
    """Llama-3.x-Instruct's eos_token_id is a list: the export keeps it (it died with a
    TypeError, leaving a half folder) and names the first id's token in tokenizer_config."""
    from transformers import AutoModelForCausalLM

    from tests.helpers.hf_llama import tiny_hf_llama
    from tests.helpers.hf_tokenizer import llama3_tokenizer

    source = tmp_path / "hf"
    tiny_hf_llama(source, vocab=300, layers=2)
    llama3_tokenizer(source / "tokenizer.json")
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "bos_token_id": 0, "eos_token_id": [1, 3]}))
    out = tmp_path / "out"
    assert export_main(["--ckpt", str(source), "--out", str(out), "--format", "hf"]) == 0
    written = json.loads((out / "config.json").read_text())
    assert (written["bos_token_id"], written["eos_token_id"]) == (0, [1, 3])
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [1, 3]
    tokens = json.loads((out / "tokenizer_config.json").read_text())
    assert (tokens["bos_token"], tokens["eos_token"]) == ("<|begin_of_text|>", "<|end_of_text|>")
    assert AutoModelForCausalLM.from_pretrained(out).generation_config.eos_token_id == [1, 3]


# ------------------------------------------------- every writer owns what it replaces
def test_a_foreign_hugging_face_folder_is_never_replaced(checkpoint, tmp_path):
    """A bare save_pretrained folder once passed for an export: --overwrite replaced it."""
    from tests.helpers.hf_llama import tiny_hf_llama

    theirs = tmp_path / "theirs"
    tiny_hf_llama(theirs)
    before = hashes(theirs)
    for form in ("layerdrop", "hf"):
        line = refusal(layerdrop("export", "--ckpt", theirs if form == "hf" else checkpoint, "--out", theirs,
                                 "--format", form, "--overwrite", "--no-tokenizer"))
        assert "is a folder that is not an export" in line and "generation_config.json" in line, line
    assert hashes(theirs) == before


def test_an_hf_export_is_staged_and_replaced_whole(tmp_path, prepared_tokens, capsys):
    """--format hf --overwrite once wrote in place and kept a stale tokenizer.json."""
    from tests.helpers.hf_llama import tiny_hf_llama

    tiny_hf_llama(tmp_path / "source", vocab=512)
    out = tmp_path / "hf"
    tokenizer = prepared_tokens / "tokenizer.json"
    assert export_main(["--ckpt", str(tmp_path / "source"), "--out", str(out), "--format", "hf",
                        "--tokenizer", str(tokenizer)]) == 0
    assert (out / MARKER).is_file() and (out / "tokenizer.json").is_file()
    assert export_main(["--ckpt", str(tmp_path / "source"), "--out", str(out), "--format", "hf", "--overwrite",
                        "--no-tokenizer"]) == 0
    assert visible(out) == ["config.json", "generation_config.json", "model.safetensors"]
    assert not list(tmp_path.glob(".hf*"))


def test_a_linked_out_replaces_the_folder_it_points_at(checkpoint, tmp_path, capsys):
    """--out a link to an export once replaced the link with a new folder, the target unchanged."""
    target = tmp_path / "exports" / "v1"
    assert export_main(["--ckpt", str(checkpoint), "--out", str(target)]) == 0
    (tmp_path / "current").symlink_to(target)
    assert export_main(["--ckpt", str(checkpoint), "--out", str(tmp_path / "current"), "--overwrite",
                        "--no-tokenizer"]) == 0
    assert (tmp_path / "current").is_symlink() and (tmp_path / "current").resolve() == target.resolve()
    assert visible(target) == ["config.json", "model.safetensors"]


def test_a_dangling_link_as_out_is_refused_and_nothing_is_made(checkpoint, tmp_path):
    """Issue 46: --out a link to a missing folder made that folder and every missing one
    above it (a link to /a/b/c made /a and /a/b at the filesystem root)."""
    (tmp_path / "current").symlink_to(tmp_path / "missing" / "deep" / "export")
    line = refusal(layerdrop("export", "--ckpt", checkpoint, "--out", tmp_path / "current"))
    assert line == (f"error: --out '{tmp_path / 'current'}' is a link to '{tmp_path / 'missing' / 'deep' / 'export'}', "
                    "which does not exist: create that folder first, or give another --out")
    assert not (tmp_path / "missing").exists() and (tmp_path / "current").is_symlink()


@pytest.mark.parametrize("out", [".", "..", "./"])
def test_the_current_folder_is_refused_in_one_line(checkpoint, tmp_path, out):
    before = hashes(tmp_path)
    line = refusal(layerdrop("export", "--ckpt", checkpoint, "--out", out, cwd=tmp_path))
    assert f"--out {out!r} is invalid: an export replaces the folder it writes" in line
    assert hashes(tmp_path) == before


def test_a_tokenizer_that_does_not_load_or_fit_is_refused_before_it_is_copied(checkpoint, tmp_path):
    (tmp_path / "garbage.json").write_text('{"not": "a tokenizer"}')
    line = refusal(layerdrop("export", "--ckpt", checkpoint, "--out", tmp_path / "out",
                             "--tokenizer", tmp_path / "garbage.json"))
    assert "not a readable tokenizer.json" in line and "garbage.json" in line
    assert not (tmp_path / "out").exists()


def test_an_export_into_a_run_that_is_training_is_refused(checkpoint, tmp_path):
    import socket
    import subprocess
    import sys

    from framework.files.run_lock import LOCK_FILE

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / LOCK_FILE).write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(),
                                                               "command": "pretrain", "token": "x"}))
        line = refusal(layerdrop("export", "--ckpt", checkpoint, "--out", tmp_path / "run" / "export"))
        assert "is in use: `layerdrop pretrain`" in line and f"pid {holder.pid}" in line
        assert not (tmp_path / "run" / "export").exists()
    finally:
        holder.kill()
        holder.wait()
