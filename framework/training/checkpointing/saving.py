"""Checkpoints of a pretraining run: crash-safe periodic saves (keep-last-k) for every
strategy, atomic single-file writes, and the refusal to write over an earlier run's
checkpoints. Choosing the checkpoint to resume from is framework/checkpoint/resume.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint

from framework.files.atomic_write import fsync_dir, replacing
from framework.files.disk_space import DiskFull, check_room, free_bytes, is_disk_full, on_disk, size_on_disk
from framework.files.staging import is_url
from framework.checkpoint.export import EXPORT_FOLDER
from framework.checkpoint.sharded.dcp import DcpFolder
from framework.checkpoint.safety import DCP_METADATA_FILE
from framework.checkpoint.folder import (LAST, STEP_NAME, clean_leftovers, point_last, publish, remove_path, retire,
                                         staging_path, step_checkpoints)
from framework.checkpoint.saved_size import torch_save_bytes
from framework.config import PositiveInt, check
from framework.training.nonfinite import guard_of, refuse_nonfinite_state


class PeriodicCheckpoint(Checkpoint):
    """``step-XXXXXXXX.ckpt`` every ``every_n_steps`` optimizer steps and at the end of
    the run (after the last validation, whose result it then holds), the newest
    ``keep_last`` of this run's lineage kept, and ``last.ckpt``, a link to the newest, in
    ``<default_root_dir>/checkpoints`` unless ``dirpath`` says otherwise. The folder must
    be local (the link and the renames need it).

    Every save is crash-safe whatever the strategy (one file, FSDP2's folder of shards,
    DeepSpeed's folder): written under a staging name, every rank waits for every other,
    then rank 0 renames it into place (framework/checkpoint/folder.py). Before a save
    every rank checks its parameters and optimizer state: a state holding a NaN or Inf
    is never written (the run stops instead), and a save that falls due while steps are
    being skipped for non-finite values waits for the next step that goes through.

    A new run refuses a folder that already holds checkpoints (resume it instead, or
    pick another folder): nothing on disk is overwritten unasked. A run resumed from an
    older checkpoint moves the newer ones (another lineage) into ``superseded/``, so
    that ``--resume auto`` never mixes two.

    Lightning's public ``Checkpoint`` base (not ModelCheckpoint, whose saving, linking
    and deleting are private methods that would all need overriding).
    """

    def __init__(self, every_n_steps: int = 1000, keep_last: int = 3, dirpath: str | None = None) -> None:
        for name, value in (("every_n_steps", every_n_steps), ("keep_last", keep_last)):
            check(f"checkpoint.{name}", value, PositiveInt)
        self.every_n_steps, self.keep_last, self.dirpath = every_n_steps, keep_last, dirpath
        self.saved: list[tuple[int, str]] = []  # this lineage's checkpoints on disk, oldest first
        # (step, path) of the checkpoints this run wrote or resumed from, each checked
        # finite: what the non-finite guard can recommend.
        self.finite_checkpoints: list[tuple[int, str]] = []
        self.last_model_path = ""
        self._last_saved_step: int | None = None
        self._deferred = False  # a save that fell due while steps were being skipped
        self._settled = False  # settle() ran for this fit

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.realpath(os.path.join(trainer.default_root_dir, "checkpoints"))
        self.dirpath = trainer.strategy.broadcast(str(self.dirpath))
        self._settled = False
        if is_url(self.dirpath):
            raise ValueError(f"checkpoint.dirpath={self.dirpath!r} is invalid: give a local (or mounted) folder")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The first hook where every strategy has resolved trainer.ckpt_path and loaded
        # it, and still before anything is written.
        self.settle(trainer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.settle(trainer)  # a resumed run with nothing left to train never reached on_train_start

    def settle(self, trainer: pl.Trainer) -> None:
        """The folder made ready for this fit, once (every rank calls it): a fresh run
        refuses an earlier run's checkpoints; a resumed one checks the state it loaded,
        removes leftovers of killed saves, sets aside checkpoints newer than the one it
        continues from, and finishes what a kill may have cut short after that one was
        renamed into place: ``last.ckpt`` pointed at it, the oldest beyond ``keep_last``
        retired. Lightning skips the training hooks of a run resumed at its last step,
        so the final export (FinalExport.on_fit_end) calls this before exporting."""
        if self._settled:
            return
        self._settled = True
        self._last_saved_step = trainer.global_step
        resumed = trainer.ckpt_path
        if resumed is None:
            refuse_earlier_checkpoints(self.dirpath)
            self.saved = []
        else:
            refuse_nonfinite_state(trainer, f"checkpoint {str(resumed)!r}",
                                   "it cannot be resumed: resume from an earlier checkpoint")
            self.finite_checkpoints.append((trainer.global_step, str(resumed)))
        if trainer.is_global_zero:
            clean_leftovers(self.dirpath)
            if resumed is not None:
                self._set_aside_newer(trainer.global_step)
                self._finish_save_of(str(resumed))
        if resumed is not None and os.path.lexists(os.path.join(self.dirpath, LAST)):
            self.last_model_path = os.path.join(self.dirpath, LAST)
        trainer.strategy.barrier("PeriodicCheckpoint.settle")

    def _finish_save_of(self, resumed: str) -> None:
        """``last.ckpt`` to the checkpoint resumed from, when it is one of this folder's
        ``step-N.ckpt`` (a real last.ckpt of an earlier layout is left alone), and the
        checkpoints beyond ``keep_last`` retired: the two steps of a save after its rename."""
        path = Path(resumed)
        link = Path(self.dirpath) / LAST
        if not STEP_NAME.match(path.name) or not path.exists() or path.resolve().parent != link.parent.resolve():
            return
        if (link.is_symlink() or not link.exists()) and link.resolve() != path.resolve():
            point_last(path, link)
            print(f"resume: {link} pointed at {path.name}, the checkpoint continued from", flush=True)
        while len(self.saved) > self.keep_last and os.path.realpath(self.saved[0][1]) != os.path.realpath(path):
            retire(self.saved.pop(0)[1])

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step == self._last_saved_step or trainer.fast_dev_run:
            return  # a micro-batch inside a step, or this step is saved already
        if 0 < trainer.max_steps <= step:
            # The last step is saved at the end of training (save_final), after its
            # validation: the checkpoint then holds that validation's result, which a
            # run resumed to finish its export reports (RunSummary's state).
            return
        if self._deferred or step % self.every_n_steps == 0:
            self.save(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.save_final(trainer)

    def save_final(self, trainer: pl.Trainer) -> None:
        """The end of the run's checkpoint (once: a second call finds it saved). The
        final export calls it first, so that a failed export loses no step."""
        if trainer.global_step != self._last_saved_step and not trainer.fast_dev_run:
            self.save(trainer, final=True)

    def save(self, trainer: pl.Trainer, final: bool = False) -> None:
        """Save this step (a collective: every rank calls it)."""
        step = trainer.global_step
        if guard_of(trainer).in_a_row and not final:
            # The weights are those that gave the non-finite values; a save now would push
            # the checkpoints from before out of the keep-last window.
            if trainer.is_global_zero and not self._deferred:
                print(f"step {step}: the checkpoint waits for a step without non-finite values",
                      file=sys.stderr, flush=True)
            self._deferred = True
            return
        self._deferred = False
        path = os.path.join(self.dirpath, f"step-{step:08d}.ckpt")
        refuse_nonfinite_state(trainer, f"the state at step {step}", f"it was not saved to {path}")
        staging = staging_path(path)
        problem = None
        if trainer.is_global_zero:
            remove_path(staging)  # a leftover of a killed save of this very step
            problem = self._room_problem(path)
        if trainer.strategy.broadcast(problem) is not None:  # every rank stops, none waits at a barrier
            raise DiskFull(f"{problem}; nothing was written{self._previous_intact(path)}")
        trainer.strategy.barrier("PeriodicCheckpoint.staging")
        saved_before = self.saved
        self.saved = [(s, p) for s, p in self.saved if p != path] + [(step, path)]  # saved with the state
        self.last_model_path = os.path.join(self.dirpath, LAST)
        io = trainer.strategy.checkpoint_io
        holds = isinstance(io, AtomicCheckpointIO)  # the same on every rank
        full = None
        try:
            if holds:  # a file only rank 0 writes (DDP): the others wait in Lightning's barrier meanwhile
                io.hold_disk_full, io.held = True, None
            # Returns after a barrier: every rank has written its part. weights_only=False said
            # explicitly: unset, Lightning logs a line at every save.
            trainer.save_checkpoint(staging, weights_only=False)
        except BaseException as err:
            # DCP raises CheckpointException (a BaseException) on every rank when one failed.
            caught = isinstance(err, Exception) or type(err).__name__ == "CheckpointException"
            if not caught or not is_disk_full(err):
                raise
            full = str(err) if isinstance(err, DiskFull) else (
                f"disk full while writing {staging}: about {self._known_size(path) or 0:,} bytes needed, "
                f"{free_bytes(self.dirpath):,} free")
        finally:
            if holds:
                io.hold_disk_full = False
        if holds:  # every rank learns how rank 0's write went, and all stop together
            full = trainer.strategy.broadcast(str(io.held) if io.held is not None else full)
        if full is not None:
            self.saved = saved_before
            if trainer.is_global_zero:
                remove_path(staging)  # never published, never linked as last
            raise DiskFull(f"{full}; nothing of this save was kept{self._previous_intact(path)}")
        if trainer.is_global_zero:
            publish(staging, path)
            point_last(path, self.last_model_path)
            while len(self.saved) > self.keep_last:
                retire(self.saved.pop(0)[1])
        else:
            self.saved = self.saved[-self.keep_last:]
        trainer.strategy.barrier("PeriodicCheckpoint.publish")
        self._last_saved_step = step
        self.finite_checkpoints.append((step, path))

    def _known_size(self, path: str) -> int | None:
        """The size of this run's newest checkpoint on disk: what the next save needs."""
        previous = next((p for _, p in reversed(self.saved) if p != path and os.path.exists(p)), None)
        return size_on_disk(previous) if previous is not None else None

    def _room_problem(self, path: str) -> str | None:
        """Why a save of known size cannot fit (the previous one is retired only after
        the new one is in place, so the whole size must be free)."""
        needed = self._known_size(path)
        if needed is None:
            return None
        try:
            check_room(path, needed, "the save (the size of the previous checkpoint)")
        except DiskFull as full:
            return str(full)
        return None

    def _previous_intact(self, path: str) -> str:
        previous = next(((s, p) for s, p in reversed(self.saved) if p != path and os.path.exists(p)), None)
        if previous is None:
            return "; this run has no earlier checkpoint: free space and start it again"
        return (f"; the previous checkpoint {previous[1]} (step {previous[0]}) is intact: free space, then "
                "continue with --resume auto")

    def _set_aside_newer(self, step: int) -> None:
        """Checkpoints newer than the one resumed from belong to a run this one replaces."""
        newer = [path for saved_step, path in step_checkpoints(self.dirpath) if saved_step > step]
        if not newer:
            return
        aside = Path(self.dirpath) / "superseded"
        aside.mkdir(exist_ok=True)
        for path in newer:
            remove_path(aside / path.name)
            os.rename(path, aside / path.name)
        print(f"resume: moved {len(newer)} checkpoint(s) newer than step {step} ({', '.join(p.name for p in newer)}) "
              f"to {aside}: they belong to the run this one replaces", flush=True)

    def newest_finite_checkpoint(self, before_step: int | None = None) -> str | None:
        """The newest checkpoint still on disk that was checked finite, optionally one
        saved before optimizer step ``before_step``."""
        for step, path in sorted(self.finite_checkpoints, reverse=True):
            if (before_step is None or step < before_step) and os.path.exists(path):
                return path
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"dirpath": self.dirpath, "saved": [list(entry) for entry in self.saved]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath") == self.dirpath:  # the same folder: the same lineage
            self.saved = [(int(step), str(path)) for step, path in state_dict.get("saved", [])]


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a local checkpoint to a temporary file beside it, fsyncs, then renames it
    over the target, so a crash mid-save leaves the previous file whole.

    Lightning's own save goes through an fsspec transaction whose temporary file lives
    in the system temp folder: when that is another filesystem the final move is a
    copy into the target, and a crash during it truncates the previous checkpoint.
    Remote paths (s3://, gs://, ...) keep Lightning's behaviour.

    ``hold_disk_full``: a full disk is kept in ``held`` instead of raised, so that the
    caller can tell every rank (PeriodicCheckpoint.save): under DDP only rank 0 writes,
    and raising there would leave the other ranks in Lightning's save barrier.
    """

    hold_disk_full = False
    held: DiskFull | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        try:
            self._save(checkpoint, path, storage_options)
        except DiskFull as full:
            if not self.hold_disk_full:
                raise
            self.held = full

    def _save(self, checkpoint: dict[str, Any], path: Any, storage_options: Any) -> None:
        if storage_options is not None or is_url(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        needed = on_disk(torch_save_bytes(checkpoint), target)  # exact: the file's own headers and pickle too
        check_room(target, needed, "the checkpoint")
        try:
            with replacing(target) as partial, open(partial, "wb") as handle:
                torch.save(checkpoint, handle)
        except Exception as err:  # torch's zip writer turns ENOSPC into a RuntimeError
            if not is_disk_full(err):
                raise
            raise DiskFull(f"disk full while writing {target}: about {needed:,} bytes needed, "
                           f"{free_bytes(target):,} free") from None
        fsync_dir(target.parent)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        # An FSDP2/HSDP folder (DCP) resumed by one process: read whole, in the form a
        # single file has (Lightning's single-device load would open the folder as a file).
        if not is_url(path) and (Path(path) / DCP_METADATA_FILE).is_file():
            return DcpFolder().training_checkpoint(Path(path))
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)


def use_atomic_checkpoint_io(trainer: pl.Trainer) -> None:
    """Swap the strategy's plain TorchCheckpointIO for the atomic one (strategies with
    their own format, e.g. DeepSpeed or sharded FSDP checkpoints, are left alone)."""
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = AtomicCheckpointIO()


def refuse_earlier_checkpoints(dirpath: str | os.PathLike, skipped: list[str] | None = None) -> None:
    """A fresh run must not write over the checkpoints of an earlier one. ``skipped``:
    what ``--resume auto`` found damaged there (then nothing in the folder could be resumed)."""
    existing = sorted(Path(dirpath).glob("*.ckpt")) if os.path.isdir(dirpath) else []
    if existing and skipped:
        raise ValueError(f"--resume auto found no complete checkpoint in {str(dirpath)!r}: "
                         f"{'; '.join(skipped)}. Move them out of the folder to start from step 0, or resume "
                         "from a copy you trust (--resume PATH)")
    if existing:
        raise ValueError(f"checkpoint folder {str(dirpath)!r} already holds {existing[0].name} from an earlier "
                         "run: resume it (--resume auto) or choose another --trainer.default_root_dir")


# What a finished run leaves in its root besides its checkpoints: the final export
# (framework/training/checkpointing/final_export.py) and RunSummary's summary.json.
RUN_OUTPUTS = (EXPORT_FOLDER, "summary.json")


def refuse_earlier_run(root: str | os.PathLike) -> None:
    """A fresh run must not replace an earlier run's export and summary, wherever its
    checkpoints go (``--checkpoint.dirpath`` elsewhere leaves the root's as they were)."""
    found = [name for name in RUN_OUTPUTS if os.path.lexists(Path(root) / name)]
    if found:
        raise ValueError(f"trainer.default_root_dir {str(root)!r} already holds {' and '.join(found)} of an earlier "
                         "run: resume that run (--resume auto with its checkpoint folder) or choose another "
                         "--trainer.default_root_dir")


__all__ = ["PeriodicCheckpoint", "AtomicCheckpointIO", "use_atomic_checkpoint_io", "refuse_earlier_checkpoints",
           "refuse_earlier_run", "RUN_OUTPUTS"]
