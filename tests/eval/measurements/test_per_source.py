"""`eval exits|skip|heldout` over several sources: each source's curve on its own validation
split, the mixture's at the top (weighted), the per-source exit plot, and the refusals."""

import json

import pytest
import yaml

from eval.inputs import ValidationData
from eval.measurements.exits import exit_losses, exits_main, skip_losses, skip_main
from eval.measurements.heldout import main as heldout_main
from framework.checkpoint import export_decoder, load_decoder
from tests.helpers.in_process import run_main
from tests.helpers.tiny_decoder import tiny_decoder

VOCAB = 300


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources_cli")
    export_decoder(tiny_decoder(seed=0), root / "dense")
    export_decoder(tiny_decoder(seed=1), root / "dropout")
    return root


def _data(folder, batches=2):
    return list(ValidationData(folder, seq_len=32, batch_size=8, max_tokens=None, max_batches=batches,
                               model_vocab_size=VOCAB))


def test_exits_per_source_and_the_mixture_weighted_as_in_training(models, mixture_sources, tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"data": {"mixture": {
        "email": {"dir": mixture_sources["email"], "weight": 3}, "http": {"dir": mixture_sources["http"], "weight": 1}}}}))
    out = tmp_path / "exits.json"
    code, printed = run_main(exits_main, ["--ckpt", models / "dense", models / "dropout", "--label", "dense", "dropout",
                                          "--mixture", config, "--seq-len", 32, "--batches", 2, "--out", out], capsys)
    assert code == 0, printed.err
    report = json.loads(out.read_text())
    assert report["mixture"] == {"email": {"dir": mixture_sources["email"], "weight": 0.75},
                                 "http": {"dir": mixture_sources["http"], "weight": 0.25}}
    for model in report["models"]:
        decoder, _ = load_decoder(models / model["label"])
        alone = {name: exit_losses(decoder, _data(folder)) for name, folder in mixture_sources.items()}
        for name in ("email", "http"):
            assert model["sources"][name]["exit_loss"] == pytest.approx(alone[name]["exit_loss"])
            assert model["sources"][name]["tokens"] == alone[name]["tokens"]
        for k in ("1", "2", "3"):
            mixed = 0.75 * alone["email"]["exit_loss"][k] + 0.25 * alone["http"]["exit_loss"][k]
            assert model["exit_loss"][k] == pytest.approx(mixed)
    assert (tmp_path / "exits-sources.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["source_plot"] == str(tmp_path / "exits-sources.png")
    assert "dense · http: exit loss" in printed.out


def test_several_named_data_folders_are_equal_weights_for_skip(models, mixture_sources, tmp_path, capsys):
    out = tmp_path / "skip.json"
    argv = ["--ckpt", models / "dense", "--data", f"email={mixture_sources['email']}",
            f"http={mixture_sources['http']}", "--seq-len", 32, "--batches", 2, "--sets", "none", "1", "--out", out]
    code, printed = run_main(skip_main, argv, capsys)
    assert code == 0, printed.err
    report = json.loads(out.read_text())
    decoder, _ = load_decoder(models / "dense")
    alone = {name: skip_losses(decoder, _data(folder), [(), (1,)]) for name, folder in mixture_sources.items()}
    for row in report["results"]:
        losses = [next(r["loss"] for r in alone[n]["results"] if r["skip_layers"] == row["skip_layers"])
                  for n in ("email", "http")]
        assert row["loss"] == pytest.approx(sum(losses) / 2)
    assert set(report["sources"]) == {"email", "http"}


def test_heldout_per_source_with_the_mixtures_standard_error(models, mixture_sources, tmp_path, capsys):
    out = tmp_path / "heldout.json"
    argv = ["--ckpt", models / "dense", "--data", f"email={mixture_sources['email']}",
            f"http={mixture_sources['http']}", "--seq-len", 32, "--max-tokens", 4000, "--groups", 4, "--out", out]
    code, printed = run_main(heldout_main, argv, capsys)
    assert code == 0, printed.err
    report = json.loads(out.read_text())
    email, http = report["sources"]["email"], report["sources"]["http"]
    assert report["loss"] == pytest.approx((email["loss"] + http["loss"]) / 2)
    assert report["standard_error"]["3"] == pytest.approx(
        ((email["standard_error"]["3"] / 2) ** 2 + (http["standard_error"]["3"] / 2) ** 2) ** 0.5)
    assert "dense · email: held-out loss" in printed.out


@pytest.mark.parametrize("data, message", [
    (["a=X", "a=Y"], "the source name 'a' is given twice"),
    (["a=X", "b=X"], "reads the same folder"),
    (["bad name=X"], "source name 'bad name' is invalid"),
])
def test_bad_source_lists_are_one_line(models, mixture_sources, tmp_path, capsys, data, message):
    data = [d.replace("X", mixture_sources["email"]).replace("Y", mixture_sources["http"]) for d in data]
    code, printed = run_main(exits_main, ["--ckpt", models / "dense", "--data", *data, "--out", tmp_path / "o.json"],
                             capsys)
    assert code == 2 and message in printed.err and len(printed.err.strip().splitlines()) == 1


def test_a_mixture_file_without_a_mixture_is_refused(models, tmp_path, capsys):
    (tmp_path / "recipe.yaml").write_text("data:\n  data_dir: data/x\n")
    code, printed = run_main(exits_main, ["--ckpt", models / "dense", "--mixture", tmp_path / "recipe.yaml",
                                          "--out", tmp_path / "o.json"], capsys)
    assert code == 2 and "has no data.mixture section" in printed.err
