"""kill -9 before, during and after checkpoint saves; `--resume auto` must continue from
the newest complete checkpoint every time, and the losses of every step must be
bit-for-bit those of a run that was never interrupted.

One chain per strategy: a run is killed at one point, resumed with `--resume auto`,
killed again at the next point, and so on until it finishes (a single process, then
both ranks of a 2-rank FSDP2 run over gloo). The kills come from test-only callbacks
given through the recipe (crash_points.py), SIGKILL to the whole process group.

Also here: the disk filling on one rank during a save (DDP, FSDP2), and an FSDP2 run
resumed on another number of processes (2 -> 4, 4 -> 2, 2 -> 1 under `single`, from FSDP2
and from HSDP).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from crash_points import read_losses, read_records, skipped_line
from pretrain_launch import LAUNCH_TIMEOUT_S, _kill_group_leftovers, pretrain_command, start, tail, tiny_recipe

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(900)]

KILLED = -9  # the launcher process died of SIGKILL


def recipe_with(out: Path, name: str, base: dict, losses: Path, kill: tuple[int, str] | None) -> Path:
    recipe = json.loads(json.dumps(base))
    callbacks = recipe["trainer"].get("callbacks", []) + [
        {"class_path": "crash_points.RecordLosses", "init_args": {"out_dir": str(losses)}}]
    if kill is not None:
        callbacks.append({"class_path": "crash_points.KillAt", "init_args": {"step": kill[0], "point": kill[1]}})
    recipe["trainer"]["callbacks"] = callbacks
    path = out / f"{name}.json"
    path.write_text(json.dumps(recipe))
    return path


def launch(recipe: Path, log: Path, *extra: str) -> tuple[int, str]:
    process = start(pretrain_command(recipe, *extra), log)
    try:
        code = process.wait(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"timed out (a hang?): {tail(log)}") from None
    finally:
        _kill_group_leftovers(process.pid)
    return code, log.read_text(errors="replace")


def run_here(recipe: Path) -> tuple[int, str]:
    """``layerdrop pretrain`` in this process (no start-up cost), on one thread like the
    launched runs (their OMP_NUM_THREADS=1), so its losses are comparable bit for bit."""
    import torch

    from framework.training.pretrain import main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return main(["--config", str(recipe)]), ""
    finally:
        torch.set_num_threads(threads)


def resumed_from(log: str) -> str | None:
    """The checkpoint named by the run's one resume line (None: started from step 0)."""
    lines = [line for line in log.splitlines() if line.startswith("resume: ")]
    assert len(lines) >= 1, log[-3000:]
    match = re.match(r"resume: continuing from (\S+) \(step \d+\)", lines[0])
    if match is None:
        assert lines[0].startswith("resume: no complete checkpoint"), lines[0]
        return None
    return Path(match[1]).name


def run_chain(tmp_path: Path, base: dict, kills: list[tuple[tuple[int, str], str | None, list[str]]],
              ranks: int) -> str:
    """Run the uninterrupted reference, then the chain: for each (kill, expected resume
    point, leftovers expected after the kill) one killed launch; then a final one.
    Returns the reference's log (none when it ran in this process: one rank)."""
    reference = tmp_path / "reference-losses"
    recipe = recipe_with(tmp_path, "reference", {**base, "trainer": {
        **base["trainer"], "default_root_dir": str(tmp_path / "reference")}}, reference, None)
    code, reference_log = run_here(recipe) if ranks == 1 else launch(recipe, tmp_path / "ref.log")
    assert code == 0, reference_log[-3000:]

    losses = tmp_path / "chain-losses"
    folder = Path(base["trainer"]["default_root_dir"]) / "checkpoints"
    expected_start: str | None = None
    for index, (kill, next_start, leftovers) in enumerate(kills + [(None, None, [])]):
        recipe = recipe_with(tmp_path, f"run{index}", base, losses, kill)
        extra = ("--resume", "auto") if index else ()
        code, log = launch(recipe, tmp_path / f"run{index}.log", *extra)
        if index:
            assert resumed_from(log) == expected_start, f"run {index}: {log[-3000:]}"
        if kill is None:
            assert code == 0, log[-3000:]
            break
        assert code == KILLED, f"run {index} was not killed at {kill}: {log[-3000:]}"
        hidden = sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) if folder.exists() else []
        for pattern in leftovers:
            assert any(re.fullmatch(pattern, name) for name in hidden), (kill, hidden)
        expected_start = next_start

    left = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    assert left == [], f"staging leftovers were not cleaned: {left}"
    for rank in range(ranks):
        want = dict(read_losses(reference, rank))
        got = read_losses(losses, rank)
        assert sorted({step for step, _ in got}) == sorted(want), rank
        # Every step, whichever launch ran it (killed ones included), had the
        # uninterrupted run's loss exactly.
        assert [(step, loss) for step, loss in got if loss != want[step]] == [], f"rank {rank}"
    assert read_losses(losses, 0)[-1][0] == max(dict(read_losses(reference, 0)))
    return reference_log


def base_recipe(tmp_path: Path, tiny_data: Path, *, strategy: str, devices: int, steps: int, every: int) -> dict:
    path = tiny_recipe(tmp_path / "base.json", data_dir=tiny_data, root=tmp_path / "run", strategy=strategy,
                       steps=steps, devices=devices, p_max=0.6, distribution="increasing", schedule="decreasing",
                       every_n_steps=every, val_check_interval=steps)
    recipe = json.loads(path.read_text())
    recipe["checkpoint"]["keep_last"] = 2
    recipe["trainer"]["logger"] = False
    return recipe


def test_single_process_survives_kills_at_every_point_of_a_save(tmp_path, tiny_data):
    base = base_recipe(tmp_path, tiny_data, strategy="single", devices=1, steps=12, every=3)
    run_chain(tmp_path, base, [
        # The first save, cut short mid-file: nothing complete, so from step 0.
        ((3, "during_save"), None, [r"\.\.step-0+3\.ckpt\.staging\.partial-\d+-\d+"]),
        # Written whole but not yet renamed: it does not count.
        ((6, "before_publish"), "step-00000003.ckpt", [r"\.step-0+6\.ckpt\.staging"]),
        # Step 9 in place, step 3 half deleted (keep_last 2), last.ckpt still on step 6.
        ((9, "during_retire"), "step-00000009.ckpt", [r"\.step-0+3\.ckpt\.deleting"]),
        # Between saves: the end of the run, before its final save.
        ((12, "before_save"), "step-00000009.ckpt", []),
        # The final checkpoint in place, last.ckpt not yet repointed: resumed with nothing
        # to train, the run exports step 12 and points last.ckpt there (it once stayed on 9).
        ((12, "before_link"), "step-00000012.ckpt", []),
    ], ranks=1)
    root = Path(base["trainer"]["default_root_dir"])
    assert os.readlink(root / "checkpoints" / "last.ckpt") == "step-00000012.ckpt"
    assert json.loads((root / "export" / "config.json").read_text())["training"]["global_step"] == 12


def test_both_fsdp_ranks_survive_kills_before_during_and_after_a_save(tmp_path, tiny_data):
    """Also: an infinite gradient on rank 1 alone at step 2 is skipped by both ranks
    (FSDP2 gradients are DTensor shards), in the reference and in the chain alike."""
    base = base_recipe(tmp_path, tiny_data, strategy="fsdp", devices=2, steps=8, every=2)
    base["trainer"]["callbacks"] = [{"class_path": "crash_points.PoisonGradient", "init_args": {"step": 2, "rank": 1}}]
    reference_log = run_chain(tmp_path, base, [
        ((3, "before_save"), "step-00000002.ckpt", []),
        ((4, "during_save"), "step-00000002.ckpt", [r"\.step-0+4\.ckpt\.staging"]),  # rank 0 mid-shard
        ((6, "before_link"), "step-00000006.ckpt", []),
    ], ranks=2)
    assert skipped_line(2) in reference_log
    for rank in range(2):
        weights = {r["step"]: r["weights"] for r in read_records(tmp_path / "reference-losses", rank)}
        assert weights[2] == weights[1] and weights[1] != weights[0] and weights[3] != weights[2]


@pytest.mark.parametrize("strategy,ranks", [("single", 1), ("fsdp", 2)])
def test_a_run_killed_during_its_final_export_makes_the_export_when_resumed(tmp_path, tiny_data, strategy, ranks):
    """kill -9 while export/ is written (the final checkpoint is saved first), then
    `--resume auto`: the export is made from that checkpoint (under FSDP2 every rank
    gathers again), equal to an uninterrupted run's, before summary.json; the killed
    export's staging folder and the dead run's folder lock are cleaned up with a note."""
    from safetensors.torch import load_file

    base = base_recipe(tmp_path, tiny_data, strategy=strategy, devices=ranks, steps=4, every=2)
    run_chain(tmp_path, base, [((4, "during_export"), "step-00000004.ckpt", [])], ranks=ranks)
    root = Path(base["trainer"]["default_root_dir"])
    log = (tmp_path / "run1.log").read_text()
    assert "took over the lock" in log and "no longer runs on this host" in log, log[-3000:]
    assert "making it now" in log, log[-3000:]
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".export")) == []
    assert (root / "summary.json").is_file() and (root / "export" / "config.json").is_file()
    # The summary is complete: the last validation ran before the export, and the final
    # checkpoint, saved after it, holds its loss (it was once null), the throughput of the
    # steps that ran, and the checkpoint.
    got, want = (json.loads((folder / "summary.json").read_text()) for folder in (root, tmp_path / "reference"))
    assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-6) and want["val_loss"] is not None
    assert got["throughput"]["tokens_per_sec"] and got["checkpoint"] == str(root / "checkpoints" / "last.ckpt")
    got, want = load_file(root / "export" / "model.safetensors"), load_file(
        tmp_path / "reference" / "export" / "model.safetensors")
    assert got.keys() == want.keys() and all(torch_equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("strategy,rank,file", [("ddp", 0, None), ("fsdp", 1, None), ("fsdp", 0, "meta.pt")],
                         ids=["ddp", "fsdp-shard", "fsdp-meta"])
def test_a_full_disk_on_one_rank_stops_every_rank_in_one_line_and_the_run_resumes(tmp_path, tiny_data, strategy,
                                                                                   rank, file):
    """ENOSPC on one rank half-way through the step-4 save (DDP: rank 0, which writes the
    file alone while the other waits in Lightning's save barrier; FSDP2: rank 1's shard,
    which DCP reports on every rank, or rank 0's meta.pt, which it writes alone after the
    shards and which once left rank 1 in that barrier): every rank stops at once with the
    same one line (file, bytes needed and free, the step-2 checkpoint intact), nothing of
    the save is kept, last.ckpt stays on step 2, and `--resume auto` finishes the run."""
    base = base_recipe(tmp_path, tiny_data, strategy=strategy, devices=2, steps=6, every=2)
    base["trainer"]["callbacks"] = [{"class_path": "crash_points.DiskFullAt",
                                     "init_args": {"step": 4, "rank": rank, "file": file}}]
    code, log = launch(recipe_with(tmp_path, "full", base, tmp_path / "losses", None), tmp_path / "full.log")
    assert code == 1, log[-3000:]
    folder = Path(base["trainer"]["default_root_dir"]) / "checkpoints"
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in log, log[-3000:]  # printed once, not once per rank
    line = errors.pop()
    assert line.startswith(f"error: disk full while writing {folder / '.step-00000004.ckpt.staging'}: about "), line
    assert "bytes needed" in line and "nothing of this save was kept" in line, line
    assert f"the previous checkpoint {folder / 'step-00000002.ckpt'} (step 2) is intact" in line, line
    assert sorted(p.name for p in folder.iterdir() if p.suffix != ".json") == ["last.ckpt", "step-00000002.ckpt"]
    assert os.readlink(folder / "last.ckpt") == "step-00000002.ckpt"

    base["trainer"]["callbacks"] = []
    code, log = launch(recipe_with(tmp_path, "resumed", base, tmp_path / "losses", None), tmp_path / "resumed.log",
                       "--resume", "auto")
    assert code == 0 and resumed_from(log) == "step-00000002.ckpt", log[-3000:]
    assert os.readlink(folder / "last.ckpt") == "step-00000006.ckpt"


def can_mount_tmpfs() -> bool:
    """Whether a private mount namespace with a tmpfs can be made here (root, or user
    namespaces allowed): the test's tmpfs then vanishes with its processes."""
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--mount", "--map-root-user", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def on_tmpfs(command: list[str], mount: Path, size: int) -> list[str]:
    """``command`` run with a fresh tmpfs of ``size`` bytes mounted on ``mount``."""
    return ["unshare", "--mount", "--map-root-user", "sh", "-c",
            f'mount -t tmpfs -o size={size} tmpfs "{mount}" && exec "$@"', "sh", *command]


@pytest.mark.skipif(not can_mount_tmpfs(), reason="needs unshare and a tmpfs mount (root or user namespaces)")
@pytest.mark.parametrize("strategy,ranks", [("single", 1), ("fsdp", 2)])
def test_a_disk_too_small_for_the_first_checkpoint_is_one_line_with_the_room_it_needs(tmp_path, tiny_data, strategy,
                                                                                     ranks):
    """A real tmpfs holding 97% of the first checkpoint's real size (more than its tensors:
    the shortfall is the files' headers, archives and index). The save is refused before it
    starts, on every rank, in one line naming the folder and the bytes it needs, at least
    the real size. Counting tensors only, the single file was let through and failed
    half-way ("N bytes needed, M free" with N < M); FSDP2 said "about 0 bytes needed, 0
    free", or, when the shards fitted and rank 0's meta.pt did not, 140-190 lines and
    tracebacks from every rank."""
    from framework.files.disk_space import size_on_disk

    base = base_recipe(tmp_path, tiny_data, strategy=strategy, devices=ranks, steps=4, every=2)
    code, log = launch(recipe_with(tmp_path, "measure", base, tmp_path / "losses", None), tmp_path / "measure.log")
    assert code == 0, log[-3000:]
    real = size_on_disk(Path(base["trainer"]["default_root_dir"]) / "checkpoints" / "step-00000002.ckpt")

    disk = tmp_path / "disk"
    disk.mkdir()
    folder = disk / "checkpoints"
    base["trainer"]["default_root_dir"] = str(tmp_path / "small")
    base["checkpoint"]["dirpath"] = str(folder)
    # The checkpoint folder's other files: the tokenizer copy and the run lock, a page or two each.
    size = int(real * 0.97) // 4096 * 4096 + 4 * 4096
    command = on_tmpfs(pretrain_command(recipe_with(tmp_path, "small", base, tmp_path / "losses", None)), disk, size)
    process = start(command, tmp_path / "small.log")
    try:
        code = process.wait(timeout=LAUNCH_TIMEOUT_S)
    finally:
        _kill_group_leftovers(process.pid)
    log = (tmp_path / "small.log").read_text(errors="replace")
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in log, log[-3000:]
    line = errors[0]
    assert line.startswith(f"error: not enough disk space for {folder}/"), line
    needed, free = (int(n.replace(",", "")) for n in re.findall(r"(\d[\d,]*) (?:bytes|are free)", line)[:2])
    assert needed >= real > free, (needed, real, free, line)
    assert "nothing of this save was kept; this run has no earlier checkpoint" in line, line


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


GLOBAL_BATCH = 4  # micro-batches per optimizer step over all ranks, kept across the resume


@pytest.mark.parametrize("first,before,after,strategy", [
    ("fsdp", 2, 4, "fsdp"), ("fsdp", 4, 2, "fsdp"), ("fsdp", 2, 1, "single"), ("hsdp", 2, 1, "single")],
    ids=["2-to-4", "4-to-2", "2-to-1-single", "hsdp-2-to-1-single"])
def test_an_fsdp_run_resumes_on_another_number_of_processes_with_the_same_batches(tmp_path, tiny_data, first,
                                                                                   before, after, strategy):
    """Losing (or gaining) nodes: an FSDP2 (or HSDP) run on ``before`` processes resumed from its
    step-2 DCP folder on ``after``: model and optimizer resharded by DCP (or, under
    ``single``, gathered whole into the one process), gradient accumulation set to keep
    the global batch of 4 micro-batches, and litdata's elastic resume continuing the
    first run's sample order: steps 2 and 3 see exactly the rows the uninterrupted run
    saw (the sums of their token ids) and give its loss (dense, so no mask depends on
    the rank; only the order of float sums differs)."""
    from tests.helpers.step_records import records

    accumulation = GLOBAL_BATCH // before  # the recipe's, kept in the resumed launch's recipe

    def recipe(name: str, devices: int, strategy: str, losses: Path) -> Path:
        path = tiny_recipe(tmp_path / f"{name}.json", data_dir=tiny_data, root=tmp_path / "run", strategy=strategy,
                           steps=4, devices=devices, p_max=0.0, every_n_steps=2, val_check_interval=4, callbacks=[
                               {"class_path": "tests.helpers.tiny_training.RecordLosses",
                                "init_args": {"path": str(losses)}}])
        spec = json.loads(path.read_text())
        spec["trainer"].update(accumulate_grad_batches=accumulation, logger=False)
        path.write_text(json.dumps(spec))
        return path

    reference, resumed = tmp_path / "reference.jsonl", tmp_path / "resumed.jsonl"
    code, log = launch(recipe("before", before, first, reference), tmp_path / "before.log")
    assert code == 0, log[-3000:]
    halfway = tmp_path / "run" / "checkpoints" / "step-00000002.ckpt"
    code, log = launch(recipe("after", after, strategy, resumed), tmp_path / "after.log", "--resume", str(halfway))
    assert code == 0, log[-3000:]
    how = "gathered whole from the DCP shards" if strategy == "single" else "resharded by DCP"
    assert (f"resume: {before} -> {after} processes: gradient accumulation {accumulation} -> "
            f"{GLOBAL_BATCH // after} keeps the global batch of {GLOBAL_BATCH} micro-batches; model and optimizer "
            f"{how}") in log, log[-3000:]

    def per_step(path: Path, accumulated: int) -> dict[int, tuple[int, float, int]]:
        """step -> (token-id sum of its rows, mean loss, micro-batches); Lightning hands
        back each micro-batch's loss divided by the accumulation."""
        steps: dict[int, list[dict]] = {}
        for record in records(path):
            steps.setdefault(record["step"], []).append(record)
        return {s: (sum(r["batch"] for r in rs), accumulated * sum(r["loss"] for r in rs) / len(rs), len(rs))
                for s, rs in steps.items()}

    want, got = per_step(reference, accumulation), per_step(resumed, GLOBAL_BATCH // after)
    assert sorted(got) == [2, 3]
    for step in (2, 3):
        assert got[step][0] == want[step][0] and got[step][2] == want[step][2] == GLOBAL_BATCH, (step, got, want)
        assert abs(got[step][1] - want[step][1]) < 1e-4 * abs(want[step][1]), (step, got[step], want[step])
