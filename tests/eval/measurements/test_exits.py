import json

import pytest
import torch
import torch.nn.functional as F

from eval.measurements.exits import default_labels, exit_losses, exits_main, parse_exit_layers, skip_losses, skip_main
from eval.inputs import ValidationData, capped_batches
from framework.checkpoint import export_decoder, load_decoder
from framework.model.loss import IGNORE_INDEX
from tests.helpers.battery import layerdrop, refusal
from tests.helpers.in_process import run_main
from tests.helpers.tiny_decoder import tiny_decoder  # vocabulary VOCAB

VOCAB = 300


def batches(seed=1, count=3, batch=2, seq=13):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        tokens = torch.randint(0, VOCAB, (batch, seq + 1), generator=gen)
        targets = tokens[:, 1:].clone()
        targets[0, :3] = IGNORE_INDEX  # padding-like positions are left out of the mean
        out.append((tokens[:, :-1], targets))
    return out


def reference_loss(decoder, data, **forward):
    """The slow way: one full forward per configuration, mean over counted tokens."""
    total, count = 0.0, 0
    with torch.no_grad():
        for inputs, targets in data:
            logits = decoder(inputs, **forward)
            total += F.cross_entropy(logits.flatten(0, 1).double(), targets.flatten(), reduction="sum",
                                     ignore_index=IGNORE_INDEX).item()
            count += int((targets != IGNORE_INDEX).sum())
    return total / count


@pytest.mark.parametrize("chunk_tokens", [7, None])
def test_every_exit_equals_a_forward_with_that_exit_layer(chunk_tokens):
    decoder, data = tiny_decoder(n_layers=4), batches()
    report = exit_losses(decoder, data, chunk_tokens=chunk_tokens)
    assert report["num_layers"] == 4
    assert report["tokens"] == sum(int((t != IGNORE_INDEX).sum()) for _, t in data)
    assert list(report["exit_loss"]) == ["1", "2", "3", "4"]
    for k in range(1, 5):
        assert report["exit_loss"][str(k)] == pytest.approx(reference_loss(decoder, data, exit_layer=k), abs=1e-5)
    assert report["exit_loss"]["4"] == pytest.approx(reference_loss(decoder, data), abs=1e-5)
    assert len(set(round(v, 4) for v in report["exit_loss"].values())) == 4  # the exits really differ


def test_a_subset_of_exits_gives_the_same_numbers():
    decoder, data = tiny_decoder(n_layers=4), batches()
    every = exit_losses(decoder, data)["exit_loss"]
    subset = exit_losses(decoder, data, exits=[3, 1])
    assert subset["exit_loss"] == {"1": pytest.approx(every["1"]), "3": pytest.approx(every["3"])}
    with pytest.raises(ValueError, match="exit_layer=5 is invalid: must be an integer in 1..4"):
        exit_losses(decoder, data, exits=[5])


@pytest.mark.parametrize("spec, expected", [("2-4,6", [2, 3, 4, 6]), ("1-6", [1, 2, 3, 4, 5, 6]), ("5", [5])])
def test_exit_layer_specs(spec, expected):
    assert parse_exit_layers(spec, 6) == expected


@pytest.mark.parametrize("spec, message", [("0", r"\[0\] outside 1..6"), ("3-7", r"\[7\] outside 1..6"),
                                           ("x", "like 2,4 or 2-6")])
def test_bad_exit_layer_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_exit_layers(spec, 6)


def test_every_skip_set_equals_a_forward_with_those_layers_skipped():
    decoder, data = tiny_decoder(n_layers=4), batches()
    skips = [(), (1, 3), (0,), (2,), (1, 2)]
    report = skip_losses(decoder, data, skips, chunk_tokens=5)
    by_set = {tuple(r["skip_layers"]): r for r in report["results"]}
    assert set(by_set) == set(skips)
    for skip in skips:
        assert by_set[skip]["loss"] == pytest.approx(reference_loss(decoder, data, skip_layers=skip), abs=1e-5)
    kept = [r["params_kept"] for r in report["results"]]
    assert kept == sorted(kept, reverse=True) and kept[0] == decoder.num_parameters()


def test_skip_set_outside_the_model_fails_before_any_work():
    with pytest.raises(ValueError, match=r"skip_layers=\[1, 4\] is invalid: layers must be in 0..3"):
        skip_losses(tiny_decoder(n_layers=4), iter(()), [(1, 4)])


def test_caps_limit_tokens_and_batches():
    data = batches(count=4, batch=3, seq=10)
    assert sum(t.numel() for _, t in capped_batches(data, max_tokens=45)) == 40  # whole sequences only
    assert sum(t.numel() for _, t in capped_batches(data, max_tokens=5)) == 10  # at least one sequence
    assert len(list(capped_batches(data, max_batches=2))) == 2
    assert len(list(capped_batches(data))) == 4


def test_default_labels_are_the_runs_names():
    assert default_labels(["runs/demo/tiny/checkpoints/last.ckpt"]) == ["tiny"]  # never "last"
    assert default_labels(["runs/dense/checkpoints/last.ckpt", "runs/ild/checkpoints/last.ckpt"]) == \
        ["dense", "ild"]
    assert default_labels(["out/dense", "out/dropout"]) == ["dense", "dropout"]
    assert default_labels(["runs/a/step-1.ckpt", "runs/a/step-2.ckpt"]) == ["step-1", "step-2"]
    assert default_labels(["runs/x/checkpoints/step-100.ckpt", "runs/x/checkpoints/last.ckpt"]) == \
        ["x/step-100", "x/last"]  # one run twice: the run and the file


# ---------------------------------------------------------------- the commands
@pytest.fixture(scope="module")
def prepared(prepared_tokens, tmp_path_factory):
    """The suite's prepared tokens (tests/conftest.py, vocab 300) as data/, and two
    exported models."""
    root = tmp_path_factory.mktemp("exits_cli")
    (root / "data").symlink_to(prepared_tokens, target_is_directory=True)
    export_decoder(tiny_decoder(seed=0), root / "dense")
    export_decoder(tiny_decoder(seed=1), root / "dropout")
    return root


def run(main, argv, capsys):
    code, printed = run_main(main, argv, capsys)
    return code, printed.err


def test_exits_command_writes_the_report_and_plot_for_two_models(prepared, capsys):
    out = prepared / "exits.json"
    code, err = run(exits_main, ["--ckpt", prepared / "dense", prepared / "dropout", "--label", "dense", "dropout",
                                 "--data", prepared / "data", "--seq-len", 32, "--max-tokens", 2000, "--out", out],
                    capsys)
    assert code == 0, err
    report = json.loads(out.read_text())
    assert report["num_layers"] == 3 and set(report["exit_loss"]) == {"1", "2", "3"}
    assert report["tokens"] == 1984  # 62 whole sequences of 32 tokens
    assert [m["label"] for m in report["models"]] == ["dense", "dropout"]
    assert report["models"][0]["exit_loss"] == report["exit_loss"]
    data = list(ValidationData(str(prepared / "data"), seq_len=32, batch_size=8, max_tokens=2000, max_batches=None,
                               model_vocab_size=VOCAB))
    for model in report["models"]:
        decoder, _ = load_decoder(prepared / model["label"])
        for k in ("1", "2", "3"):
            assert model["exit_loss"][k] == pytest.approx(reference_loss(decoder, data, exit_layer=int(k)), abs=1e-5)
    assert (prepared / "exits.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, err = run(exits_main, ["--ckpt", prepared / "dense", "--data", prepared / "data", "--out", out], capsys)
    assert code == 2 and "already exists; pass --overwrite" in err
    code, err = run(exits_main, ["--ckpt", prepared / "dense", "--data", prepared / "data", "--exit-layers", "0-2",
                                 "--out", prepared / "never.json"], capsys)
    assert code == 2 and "[0] outside 1..3" in err


def test_skip_command_sweeps_sets_in_parameter_order(prepared, capsys):
    out = prepared / "skip.json"
    code, err = run(skip_main, ["--ckpt", prepared / "dense", "--data", prepared / "data", "--seq-len", 32,
                                "--batches", 2, "--sets", "none", "1", "0-1", "--sweep", "alternate",
                                "--out", out], capsys)
    assert code == 0, err
    report = json.loads(out.read_text())
    sets = [r["skip_layers"] for r in report["results"]]
    assert sets[0] == [] and sorted(map(tuple, sets)) == sorted([(), (1,), (0, 1), (0, 2)])
    kept = [r["params_kept"] for r in report["results"]]
    assert kept == sorted(kept, reverse=True)
    decoder, _ = load_decoder(prepared / "dense")
    data = list(ValidationData(str(prepared / "data"), seq_len=32, batch_size=8, max_tokens=None, max_batches=2,
                               model_vocab_size=VOCAB))
    for row in report["results"]:
        skip = tuple(row["skip_layers"])
        assert row["loss"] == pytest.approx(reference_loss(decoder, data, skip_layers=skip), abs=1e-5)
        assert row["params_kept"] == decoder.num_parameters() - sum(
            p.numel() for i in skip for p in decoder.blocks[i].parameters())
    assert (prepared / "skip.png").exists()


def test_a_sweep_keeps_the_full_model_as_its_first_row(prepared, capsys):
    """`--sweep single` alone used to leave the no-skip baseline out of the table and plot."""
    out = prepared / "skip-single.json"
    code, err = run(skip_main, ["--ckpt", prepared / "dense", "--data", prepared / "data", "--seq-len", 32,
                                "--batches", 1, "--sweep", "single", "--out", out], capsys)
    assert code == 0, err
    assert [r["skip_layers"] for r in json.loads(out.read_text())["results"]] == [[], [0], [1], [2]]


def test_a_sequence_longer_than_the_val_split_names_the_flag(prepared, capsys):
    """The default --seq-len is the model's window: a small val split said it held no
    sequence, without the flag to change."""
    small = prepared / "small-val"  # the prepared data, its manifest saying the val split holds 20 tokens
    small.mkdir(exist_ok=True)
    for entry in (prepared / "data").iterdir():
        if entry.name != "manifest.json" and not (small / entry.name).exists():
            (small / entry.name).symlink_to(entry)
    manifest = json.loads((prepared / "data" / "manifest.json").read_text())
    manifest["splits"]["val"]["tokens"] = 20
    (small / "manifest.json").write_text(json.dumps(manifest))
    code, err = run(exits_main, ["--ckpt", prepared / "dense", "--data", small, "--out", prepared / "never.json"],
                    capsys)
    assert code == 2 and "pass a smaller --seq-len (now 64)" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("extra, message", [
    (["--sets", "0,3"], "layers [3] are outside 0..2"),
    (["--sets", "middle-ish"], "allowed: none, alternate-odd"),
    (["--label", "a", "b"], "--label has 2 names for 1 checkpoints"),
    (["--batch-size", "0"], "--batch-size=0 is invalid"),
])
def test_skip_command_rejects_bad_input_before_loading(prepared, capsys, extra, message):
    code, err = run(skip_main, ["--ckpt", prepared / "dense", "--data", prepared / "data",
                                "--out", prepared / "never.json", *extra], capsys)
    assert code == 2 and message in err
    assert not (prepared / "never.json").exists()


def test_missing_checkpoint_and_data_are_clear_errors(prepared, capsys):
    code, err = run(exits_main, ["--ckpt", prepared / "nope", "--data", prepared / "data",
                                 "--out", prepared / "never.json"], capsys)
    assert code == 2 and "nope" in err and "does not exist" in err
    code, err = run(exits_main, ["--ckpt", prepared / "dense", "--data", prepared / "nodata",
                                 "--out", prepared / "never.json"], capsys)
    assert code == 2 and "is not a folder" in err


@pytest.mark.parametrize("command", [["eval", "exits"], ["eval", "skip"], ["eval", "heldout"]])
def test_weights_that_cannot_be_loaded_stop_in_one_line(prepared, tmp_path, command):
    """A CheckpointError raised while the weights load (here: NaN weights) once escaped
    as a traceback from these three, where every other command printed one line."""
    decoder = tiny_decoder(seed=0)
    with torch.no_grad():
        decoder.blocks[1].ffn.up.weight[0, 0] = float("nan")
    export_decoder(decoder, tmp_path / "nan")
    line = refusal(layerdrop(*command, "--ckpt", tmp_path / "nan", "--data", prepared / "data",
                             "--out", tmp_path / "report.json"))
    assert "holds non-finite weights" in line and "blocks.1.ffn.up.weight" in line
    assert not (tmp_path / "report.json").exists()
