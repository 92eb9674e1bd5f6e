"""`layerdrop export`: a real training checkpoint -> safetensors + config.json + tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

from framework.checkpoint import export_main, load_decoder
from framework.pretrain import main as pretrain
from tiny_training import tiny_cli_args


@pytest.fixture(scope="module")
def checkpoint(prepared_tokens, tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    assert pretrain(tiny_cli_args(prepared_tokens, root / "run", steps=2) + ["--trainer.logger", "false"]) == 0
    return root / "run" / "checkpoints" / "last.ckpt"


def test_export_writes_the_same_function_and_the_tokenizer(checkpoint, tmp_path, capsys):
    out = tmp_path / "export"
    assert export_main(["--ckpt", str(checkpoint), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    config = json.loads((out / "config.json").read_text())
    assert config["tokenizer"] == "tokenizer.json" and config["training"]["global_step"] == 2
    assert config["training"]["layer_dropout"]["p_max"] == 0.4
    trained, _ = load_decoder(checkpoint)
    exported, cfg = load_decoder(out)
    assert cfg == trained.config
    tokens = torch.randint(0, cfg.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(exported(tokens), trained(tokens), rtol=0, atol=0)
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size() == cfg.vocab_size
    assert "exported" in capsys.readouterr().out


def test_export_refuses_to_overwrite_unless_asked(checkpoint, tmp_path, capsys):
    out = tmp_path / "export"
    assert export_main(["--ckpt", str(checkpoint), "--out", str(out)]) == 0
    before = (out / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit) as exit_:
        export_main(["--ckpt", str(checkpoint), "--out", str(out)])
    assert exit_.value.code == 2 and "pass --overwrite" in capsys.readouterr().err
    assert (out / "model.safetensors").read_bytes() == before
    assert export_main(["--ckpt", str(checkpoint), "--out", str(out), "--overwrite"]) == 0


def test_missing_checkpoint_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        export_main(["--ckpt", str(tmp_path / "nope.ckpt"), "--out", str(tmp_path / "x")])
    assert exit_.value.code == 2
    assert "error: checkpoint" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path, capsys):
    class Payload:
        def __reduce__(self):
            return (exec, ("open(%r, 'w').write('pwned')" % str(tmp_path / "pwned"),))

    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "layerdrop": {"model_config": {}}, "x": Payload()}, path)
    with pytest.raises(SystemExit):
        export_main(["--ckpt", str(path), "--out", str(tmp_path / "out")])
    assert "cannot be loaded safely" in capsys.readouterr().err
    assert not (tmp_path / "pwned").exists()


def test_re_exporting_an_export_keeps_its_record(checkpoint, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    assert export_main(["--ckpt", str(checkpoint), "--out", str(first)]) == 0
    assert export_main(["--ckpt", str(first), "--out", str(second)]) == 0
    assert json.loads((second / "config.json").read_text()) == json.loads((first / "config.json").read_text())
    assert (second / "tokenizer.json").read_bytes() == (first / "tokenizer.json").read_bytes()
