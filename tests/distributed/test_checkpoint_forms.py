"""The checkpoints of real 2-rank runs, read in one process without a process group.

Runs (each made once per session): the DDP reference run (single-file .ckpt) and its
recipe under FSDP2 (ModelParallelStrategy, gloo) and DeepSpeed ZeRO-2 (the test-only
CPU strategy), all from conftest.py; ZeRO-3 has a run of its own, of a wider
Llama-family model (d=512, grouped-query attention, untied: 65 MB of fp32 weights) so
that a loader reading the optimizer's moments (130 MB) would show in its peak memory,
and so that the ZeRO folder's reader meets the Llama family's parameters.

Checked: every form loads to the function the live model computed at the end of
training (``logits_probe.LogitsProbe``), and so does the export written at the end of
the run and `layerdrop export` of every form; the loaders never touch the optimizer
state; a pickle payload planted in each pickled file of each form is refused, with
one line naming the file, by every command that takes --ckpt and by
`pretrain --resume`, and the payload never runs (while the library's own reader of
that file does run it); and the chain pretrain (fsdp) -> eval exits -> adapters fit
-> speculate run works on the sharded folder as it is.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pretrain_launch import LLAMA, clean_env, pretrain_command, run, shared_once, tiny_recipe

from framework.checkpoint import CKPT_KEY, Checkpoint, checkpoint_form, load_decoder, read_metadata
from framework.checkpoint.tokenizer_record import sha256_of

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 2  # the ZeRO-3 run's
WIDE = {**LLAMA, "tie_embeddings": False, "d_model": 512, "ffn_hidden": 2048}  # 16.2M parameters: 65 MB fp32
FORMS = {"fsdp": "dcp", "zero2": "deepspeed", "zero3": "deepspeed"}  # name: expected form
PLANTED = [  # (form, file) : every pickled file of every form
    ("single", "last.ckpt"),
    ("fsdp", ".metadata"), ("fsdp", "meta.pt"), ("fsdp", "__0_0.distcp"), ("fsdp", "__1_0.distcp"),
    ("zero2", "checkpoint/mp_rank_00_model_states.pt"),
    ("zero2", "checkpoint/zero_pp_rank_0_mp_rank_00_optim_states.pt"),
    ("zero2", "checkpoint/zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    ("zero3", "checkpoint/zero_pp_rank_0_mp_rank_00_model_states.pt"),
    ("zero3", "checkpoint/zero_pp_rank_1_mp_rank_00_model_states.pt"),
    ("zero3", "checkpoint/zero_pp_rank_0_mp_rank_00_optim_states.pt"),
    ("zero3", "checkpoint/zero_pp_rank_1_mp_rank_00_optim_states.pt"),
]


def zero3_recipe(out: Path, data: Path) -> Path:
    strategy = {"class_path": "cpu_deepspeed.CPUDeepSpeedStrategy", "init_args": {"stage": 3}}
    recipe = tiny_recipe(out / "recipe.json", data_dir=data, root=out / "run", strategy=strategy, steps=STEPS,
                         every_n_steps=1000, logits_out=out / "logits.pt")
    config = json.loads(recipe.read_text())
    config["model"]["decoder"].update(WIDE)
    config["trainer"]["limit_val_batches"] = 0  # validation checks nothing here
    recipe.write_text(json.dumps(config, indent=2))
    return recipe


@pytest.fixture(scope="module")
def runs(shared_dir: Path, tiny_data: Path, ddp_run: Path, fsdp2_fp32_run: Path, zero2_run: Path) -> dict[str, Path]:
    zero3 = shared_once(shared_dir, "ckpt-zero3-run",
                        lambda out: run(pretrain_command(zero3_recipe(out, tiny_data)), out / "log.txt"))
    return {"single": ddp_run, "fsdp": fsdp2_fp32_run, "zero2": zero2_run, "zero3": zero3}


def last(run_dir: Path) -> Path:
    return run_dir / "run" / "checkpoints" / "last.ckpt"


def logits_of(decoder, tokens: torch.Tensor) -> torch.Tensor:
    torch.set_num_threads(1)  # the runs' ranks compute on one thread each
    with torch.no_grad():
        return decoder(tokens)


# ------------------------------------------------------------------ loading


@pytest.mark.parametrize("name", list(FORMS))
def test_every_form_loads_in_one_process_to_the_trained_function(runs, name, monkeypatch):
    probe = torch.load(runs[name] / "logits.pt", weights_only=True)
    if name == "zero3":  # ZeRO-3 trains with its own F.linear (bias added after the matmul): the same sums
        from deepspeed.runtime.zero.linear import zero3_linear_wrap

        monkeypatch.setattr(torch.nn.functional, "linear", zero3_linear_wrap)
    ckpt = last(runs[name])
    assert checkpoint_form(ckpt) == FORMS[name]
    decoder, cfg = load_decoder(ckpt)
    assert not torch.distributed.is_initialized()
    torch.testing.assert_close(logits_of(decoder, probe["tokens"]), probe["logits"], rtol=0, atol=0)
    # The export the run wrote at its end (gathered on rank 0) is the same function.
    exported, exported_cfg = load_decoder(runs[name] / "run" / "export")
    assert exported_cfg == cfg
    torch.testing.assert_close(logits_of(exported, probe["tokens"]), probe["logits"], rtol=0, atol=0)


def test_the_single_file_form_holds_the_parameters_the_ranks_trained(runs):
    decoder, _ = load_decoder(last(runs["single"]))
    trained = torch.load(runs["single"] / "probe" / "parameters-rank0.pt", weights_only=True)
    state = decoder.state_dict()
    assert trained.keys() == state.keys()
    for name, tensor in trained.items():
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=0)


def test_every_checkpoint_records_its_tokenizer_and_finds_it_from_anywhere(runs, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name in FORMS:
        ckpt = last(runs[name])
        kept = ckpt.parent / "tokenizer.json"
        entry = read_metadata(ckpt)[CKPT_KEY]
        assert entry["tokenizer"]["sha256"] == sha256_of(kept) and os.path.isabs(entry["data_dir"])
        assert Checkpoint.open(ckpt).find_tokenizer() == kept.resolve()
        assert (runs[name] / "run" / "export" / "tokenizer.json").read_bytes() == kept.read_bytes()


@pytest.mark.parametrize("name", ["single", *FORMS])
def test_layerdrop_export_of_every_form(runs, name, tmp_path):
    from framework.checkpoint.export import MARKER, main as export

    ckpt, out = last(runs[name]), tmp_path / "export"
    assert export(["--ckpt", str(ckpt), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "config.json", "model.safetensors", "tokenizer.json"]
    config = json.loads((out / "config.json").read_text())
    assert config["training"]["global_step"] == read_metadata(ckpt)["global_step"]
    assert config["tokenizer"]["sha256"] == sha256_of(out / "tokenizer.json")
    original, _ = load_decoder(ckpt)
    exported, _ = load_decoder(out)
    for (key, a), (_, b) in zip(original.state_dict().items(), exported.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=key)


# ------------------------------------------------------------------ memory


def test_the_sharded_loader_reads_model_entries_only(runs, monkeypatch):
    from framework.checkpoint.sharded.dcp_reader import SafeFileSystemReader

    requested: list[str] = []
    original = SafeFileSystemReader.read_data

    def recording(self, plan, planner):
        requested.extend(item.storage_index.fqn for item in plan.items)
        return original(self, plan, planner)

    monkeypatch.setattr(SafeFileSystemReader, "read_data", recording)
    decoder, _ = load_decoder(last(runs["fsdp"]))
    assert requested and all(fqn.startswith("state_dict.model.") for fqn in requested)
    assert {fqn.removeprefix("state_dict.model.") for fqn in requested} == set(decoder.state_dict())


PEAK_SCRIPT = """
import gc, json, re, sys
from pathlib import Path
import torch
import framework.checkpoint, framework.checkpoint.safety
import framework.checkpoint.sharded.zero, framework.checkpoint.sharded.dcp_reader
from framework.checkpoint import load_decoder
from framework.checkpoint.safety import load_torch_file

def resident(field):
    return 1024 * int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))

def peak_of(work):
    gc.collect()
    open("/proc/self/clear_refs", "w").write("5")  # the peak restarts from the current size
    before = resident("VmRSS")
    kept = work()
    return resident("VmHWM") - before, kept

path = Path(sys.argv[1])
load_decoder(path)  # once first: the torch kernels' code pages count as resident when first run
loader, (decoder, _) = peak_of(lambda: load_decoder(path))
model = sum(t.numel() * t.element_size() for t in decoder.state_dict().values())
del decoder
files = sorted(path.rglob("*optim_states.pt"))  # what reading whole optimizer files costs
control, _ = peak_of(lambda: [load_torch_file(f, deepspeed=True, mmap=False) for f in files])
print(json.dumps({"model": model, "loader": loader, "control": control}))
"""


def test_the_zero_loader_holds_the_model_not_the_optimizer_state(runs):
    """Peak resident memory of load_decoder: the decoder plus the fp32 partitions it
    copies from, piece by piece (2x the model), against reading the optimizer files
    whole (3x: masters and two Adam moments). Large allocations are returned to the system on free (a
    fixed mmap threshold), so a measurement is not hidden by memory an earlier step
    kept; a first load pages in torch's code, which would otherwise count too."""
    env = {**clean_env(), "MALLOC_MMAP_THRESHOLD_": "131072"}
    result = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(last(runs["zero3"]).resolve())], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    peaks = json.loads(result.stdout.strip().splitlines()[-1])
    model = peaks["model"]
    assert model > 60e6
    assert 0.9 * model < peaks["loader"] < 2.5 * model < peaks["control"], peaks


# ------------------------------------------------------------------ payloads


class WritesMarker:
    """Unpickling this calls open(marker, "w"): the file appears if a reader runs code."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def plant(runs: dict[str, Path], form: str, relative: str, root: Path, marker: Path) -> tuple[Path, Path]:
    """A copy of the form's last checkpoint (files hard-linked) with a payload planted in
    ``relative``; returns (checkpoint, planted file)."""
    source = last(runs[form]).resolve()
    if form == "single":
        target = root / "checkpoints" / "step-00000030.ckpt"
        target.parent.mkdir(parents=True)
        shutil.copyfile(source, target)
        file = target
    else:
        target = root / "checkpoints" / f"step-{STEPS:08d}.ckpt"
        shutil.copytree(source, target, copy_function=os.link)
        file = target / relative
    if relative.endswith(".distcp"):
        _plant_byte_entry(target, relative, marker)
    elif relative == ".metadata":
        metadata = pickle.loads(file.read_bytes())
        metadata.planner_data["payload"] = WritesMarker(marker)
        _replace(file, pickle.dumps(metadata))
    else:
        content = torch.load(file, map_location="cpu", weights_only=False)  # our own run's file
        content["payload"] = WritesMarker(marker)
        buffer = io.BytesIO()
        torch.save(content, buffer)
        _replace(file, buffer.getvalue())
    return target, file


def _replace(file: Path, data: bytes) -> None:
    file.unlink()  # a hard link: the run's own file stays as it was
    file.write_bytes(data)


def _plant_byte_entry(folder: Path, distcp: str, marker: Path) -> None:
    """Append a torch.save'd payload to ``distcp`` and point a byte entry (an optimizer
    hyper-parameter, which DCP loads with weights_only=False) at it."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    metadata = pickle.loads((folder / ".metadata").read_bytes())
    key = next(k for k, v in metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata))
    index = next(i for i in metadata.storage_data if i.fqn == key)
    blob = io.BytesIO()
    torch.save(WritesMarker(marker), blob)
    data = (folder / distcp).read_bytes()
    _replace(folder / distcp, data + blob.getvalue())
    metadata.storage_data[index] = _StorageInfo(distcp, len(data), len(blob.getvalue()))
    _replace(folder / ".metadata", pickle.dumps(metadata))


def run_library_reader(checkpoint: Path, file: Path) -> None:
    """What the library itself does with the planted file (this runs the payload)."""
    if file.name == ".metadata" or file.suffix == ".distcp":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        dcp_to_torch_save(checkpoint, checkpoint.parent / "consolidated.pt")
    else:
        torch.load(file, map_location="cpu", weights_only=False)


def run_library_reader_expecting_the_payload(checkpoint: Path, file: Path) -> None:
    try:
        run_library_reader(checkpoint, file)
    except Exception:  # the payload returned an open file where a value belonged: the reader may stop there
        pass


@pytest.fixture(scope="module")
def chain(runs, shared_dir: Path, tiny_data: Path) -> Path:
    """pretrain (fsdp, 2 ranks) -> eval exits -> adapters fit -> speculate run, on the
    sharded last.ckpt folder as the run left it, through the command-line entry point
    (in this process: the run's ranks are long gone, nothing here needs a group)."""
    from framework.cli import main as cli

    ckpt = str(last(runs["fsdp"]))
    commands = {
        "exits": ["eval", "exits", "--ckpt", ckpt, "--data", str(tiny_data), "--batches", "2", "--device", "cpu"],
        "adapters": ["adapters", "fit", "--ckpt", ckpt, "--data", str(tiny_data), "--max-steps", "2",
                     "--batch-size", "2", "--accelerator", "cpu"],
        "speculate": ["speculate", "run", "--ckpt", ckpt, "--skip-layers", "1", "--data", str(tiny_data),
                      "--num-prompts", "1", "--max-new-tokens", "4", "--repeats", "1"],
    }

    def make(out: Path) -> None:
        for name, argv in commands.items():
            target = out / name if name == "adapters" else out / f"{name}.json"
            assert cli([*argv, "--out", str(target)]) == 0, name

    return shared_once(shared_dir, "ckpt-chain", make)


def test_the_chain_runs_on_the_sharded_folder_without_conversion(chain):
    exits = json.loads((chain / "exits.json").read_text())
    assert exits["num_layers"] == 4 and sorted(exits["exit_loss"], key=int) == ["1", "2", "3", "4"]
    assert (chain / "adapters" / "adapters.safetensors").is_file()
    assert json.loads((chain / "speculate.json").read_text())["identical_to_greedy"] is True


def commands(checkpoint: Path, out: Path, data: Path, adapters: Path, recipe: Path) -> dict[str, list[str]]:
    """Every command that takes --ckpt (coord-check trains its own models), and resume."""
    c = str(checkpoint)
    return {
        "eval exits": ["eval", "exits", "--ckpt", c, "--data", str(data), "--out", str(out / "e.json")],
        "eval skip": ["eval", "skip", "--ckpt", c, "--data", str(data), "--out", str(out / "s.json")],
        "eval downstream": ["eval", "downstream", "--ckpt", c, "--tasks", "piqa", "--out", str(out / "d.json")],
        "adapters fit": ["adapters", "fit", "--ckpt", c, "--data", str(data), "--out", str(out / "a")],
        "adapters eval": ["adapters", "eval", "--adapters", str(adapters), "--ckpt", c, "--data", str(data),
                          "--out", str(out / "ae.json")],
        "speculate search": ["speculate", "search", "--ckpt", c, "--data", str(data), "--out", str(out / "ss.json")],
        "speculate run": ["speculate", "run", "--ckpt", c, "--skip-layers", "1", "--data", str(data),
                          "--out", str(out / "sr.json")],
        "export": ["export", "--ckpt", c, "--out", str(out / "x")],
        "pretrain --resume": ["pretrain", "--config", str(recipe), "--resume", c],
    }


class WouldTrain(RuntimeError):
    pass


@pytest.mark.parametrize("form,relative", PLANTED, ids=[f"{f}:{r.rsplit('/', 1)[-1]}" for f, r in PLANTED])
def test_a_payload_in_any_pickled_file_is_refused_by_every_command(runs, chain, tiny_data, form, relative,
                                                                   tmp_path, capsys, monkeypatch):
    from eval.downstream.lm_eval_adapter import LayerDropLM
    from framework.checkpoint import CheckpointError
    from framework.cli import main as cli
    from tests.helpers.in_process import exit_code

    marker = tmp_path / "marker"
    checkpoint, file = plant(runs, form, relative, tmp_path / "run", marker)
    # A resume that got past the checks would start training: stop it there instead.
    monkeypatch.setattr("lightning.pytorch.Trainer.fit", lambda *a, **k: (_ for _ in ()).throw(WouldTrain()))
    recipe = runs[form] / "recipe.json"
    for name, argv in commands(checkpoint, tmp_path, tiny_data, chain / "adapters", recipe).items():
        code = exit_code(cli, argv)
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if str(file) in line]
        assert code not in (0, None) and len(lines) == 1 and "refused" in lines[0], f"{name}: {err[-2000:]}"
        assert "Traceback" not in err, name
        assert not marker.exists(), name
    with pytest.raises(CheckpointError, match="refused") as refusal:
        LayerDropLM(ckpt=str(checkpoint))
    assert str(file) in str(refusal.value) and "\n" not in str(refusal.value)
    assert not marker.exists()
    run_library_reader_expecting_the_payload(checkpoint, file)  # the payload is real: the library runs it
    assert marker.exists()


def test_a_deepspeed_tag_pointing_outside_the_checkpoint_is_refused(runs, tmp_path):
    from framework.checkpoint import CheckpointError
    from framework.checkpoint.safety import prove_checkpoint_harmless

    copy = tmp_path / "step.ckpt"
    shutil.copytree(last(runs["zero2"]).resolve(), copy, copy_function=os.link)
    (copy / "latest").unlink()
    (copy / "latest").write_text(str(tmp_path / "elsewhere"))
    with pytest.raises(CheckpointError, match="latest.*is refused"):
        prove_checkpoint_harmless(copy)
    with pytest.raises(CheckpointError, match="latest"):
        load_decoder(copy)
