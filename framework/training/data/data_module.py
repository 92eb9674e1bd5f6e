"""The LightningDataModule over a folder made by `layerdrop prepare`.

Batches are ``(inputs, targets)``: two int64 tensors ``[batch_size, seq_len]``, the
targets shifted by one token (``TokensLoader`` serves blocks of ``seq_len + 1``
tokens; blocks follow each other without overlap and never straddle a chunk).

* train: litdata ``StreamingDataset`` + ``StreamingDataLoader``, shuffled with
  ``seed`` (a new order every epoch), sharded over ranks and loader workers by
  litdata, ``drop_last`` so every rank sees the same number of batches;
* val: a fixed set of ``val_batches * batch_size`` blocks spread evenly over the
  whole val split (every k-th block, in order; the whole split when it is smaller),
  whatever the number of ranks (Lightning's DistributedSampler shares them out), so
  validation losses of different runs compare. Spread, not a prefix: a prefix of a
  split is a handful of documents, a spread sample draws on every part of it (on a
  model of recipes/sweeps/paper-cpu.yaml, 256 sequences as a prefix scored 3.2% below
  the whole split's loss, spread over it 0.4% above);
* the folder may be a local path or any URL litdata streams from (``s3://``,
  ``gs://``, ``local:``...); ``manifest.json`` is read at ``setup`` and checked
  against the model (``model_vocab_size``) and ``seq_len`` before a batch is drawn.

A mixture (``mixture={name: {dir, weight}}`` instead of ``data_dir``; framework/training/data/mixture.py)
draws each training sequence's source with the weights and streams each source with its
own loader (framework/training/data/mixture_loader.py): batches are then ``(inputs, targets,
sources)``, ``sources`` the int64 source index of each row. Each source cycles on its own.
Validation is one fixed, spread set per source (``val_dataloader`` returns one loader per
source, in the mixture's order).

Exact resume. The train loader's state (litdata's sample counters, epoch and
shuffle seed) is this DataModule's ``state_dict``, which Lightning stores in every
checkpoint under the class name and hands back to ``load_state_dict`` on resume;
the next batch is then the one the uninterrupted run would have drawn. Lightning
2.6's fit loop also saves and restores stateful train loaders on its own (the same
state, restored twice, harmlessly); the DataModule's copy is what custom loops and
tests use. Lightning does not prefetch from a loader with a length, so the saved
state is that of the last batch trained on (tests/training/data/test_data_module.py checks this end to
end through a Trainer).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
import torch
from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
from torch.utils.data import DataLoader, Dataset

from framework.config import NonNegativeInt, PositiveInt, check
from framework.files.manifest import MANIFEST_FILE, MANIFEST_FORMAT, read_manifest
from framework.training.data.mixture import MixturePhases, check_same_language, describe, parse_mixture, parse_schedule
from framework.training.data.mixture_loader import MixtureLoader, stack_collate


def shift_collate(blocks: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks of seq_len + 1 tokens -> (inputs, targets), int64 [B, seq_len] each."""
    stacked = torch.from_numpy(np.stack([np.asarray(block) for block in blocks]).astype(np.int64))
    return stacked[:, :-1], stacked[:, 1:]


def spread_indices(total: int, count: int) -> list[int]:
    """``count`` block indices out of ``total``, evenly spaced and in order (all when
    ``count >= total``)."""
    if count >= total:
        return list(range(total))
    return [i * total // count for i in range(count)]


class FixedBlocks(Dataset):
    """``count`` blocks of a StreamingDataset spread evenly over it (map-style)."""

    def __init__(self, dataset: StreamingDataset, count: int, total: int | None = None) -> None:
        self.dataset = dataset
        self.indices = spread_indices(len(dataset) if total is None else total, count)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self.indices[int(index)]]


class TokenDataModule(L.LightningDataModule):
    """Streams a `layerdrop prepare` folder as (inputs, targets) batches; resumes exactly.

    Args:
        data_dir: the prepared folder (local path or object-store URL).
        mixture: instead of ``data_dir``, several prepared folders with weights,
            ``{name: {dir: FOLDER, weight: W}}`` (framework/training/data/mixture.py).
        mixture_schedule: other weights from given steps on, ``[{from_step, weights}]``.
        seq_len: tokens per training sequence (blocks of seq_len + 1 are read).
        batch_size: sequences per batch on each device (the micro-batch).
        num_workers: loader worker processes per device (0: in the main process).
        val_batches: size of the fixed validation set, in batches of ``batch_size``
            (spread over the whole val split; more than the split holds: all of it).
        seed: shuffling seed of the train split.
        shuffle: shuffle the train split (off: corpus order, for debugging).
        model_vocab_size: when given, `setup` checks the data fits the embedding.
        storage_options: passed to litdata for object-store access.
    """

    def __init__(self, data_dir: str | None = None, seq_len: int = 256, batch_size: int = 16,
                 num_workers: int = 0, val_batches: int = 16, seed: int = 42, shuffle: bool = True,
                 model_vocab_size: int | None = None, storage_options: dict | None = None,
                 mixture: dict[str, dict[str, Any]] | None = None,
                 mixture_schedule: list[dict[str, Any]] | None = None) -> None:
        super().__init__()
        if (data_dir is None) == (mixture is None):
            raise ValueError("give the data as data.data_dir (one prepared folder) or data.mixture "
                             "({name: {dir, weight}}), exactly one of them (a recipe's data_dir is "
                             "cleared with --data.data_dir null)")
        if mixture_schedule is not None and mixture is None:
            raise ValueError("data.mixture_schedule is invalid without data.mixture: it changes a mixture's weights")
        self.sources = parse_mixture(mixture) if mixture is not None else None
        self.schedule = [] if self.sources is None else (
            parse_schedule(mixture_schedule, self.sources) if mixture_schedule is not None else [(0, self.sources)])
        for name, value in (("seq_len", seq_len), ("batch_size", batch_size), ("val_batches", val_batches)):
            check(name, value, PositiveInt)
        check("num_workers", num_workers, NonNegativeInt)
        if model_vocab_size is not None:
            check("model_vocab_size", model_vocab_size, PositiveInt)
        self.save_hyperparameters(ignore=["storage_options"])  # may hold credentials: never in a checkpoint
        # the first source stands for the mixture where one folder is asked for (the
        # tokenizer, its vocabulary): every source has the same (check_same_language)
        self.data_dir = (data_dir if self.sources is None else self.sources[0].dir).rstrip("/")
        self.seq_len, self.batch_size, self.num_workers = seq_len, batch_size, num_workers
        self.val_batches, self.seed, self.shuffle = val_batches, seed, shuffle
        self.model_vocab_size = model_vocab_size
        self.storage_options = storage_options or {}
        self.manifest: dict | None = None
        self.manifests: list[dict] = []
        self.phases = MixturePhases()
        self._train_loader: StreamingDataLoader | MixtureLoader | None = None
        self._state_to_load: dict | None = None

    # -- the manifest and its checks ------------------------------------------------

    @property
    def folders(self) -> list[str]:
        """The prepared folders read: the one ``data_dir``, or each source's, in order."""
        return [self.data_dir] if self.sources is None else [source.dir for source in self.sources]

    def setup(self, stage: str | None = None) -> None:
        if not self.manifests:
            self.manifests = [self._read_manifest(folder) for folder in self.folders]
            if self.sources is not None:
                check_same_language(self.sources, self.manifests)
            self.manifest = self.manifests[0]
        if self.model_vocab_size is not None:
            self.check_vocab(self.model_vocab_size)
        self._check_seq_len()

    def _read_manifest(self, folder: str) -> dict:
        manifest = read_manifest(folder, self.storage_options)
        if manifest.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"{folder}/{MANIFEST_FILE} has format {manifest.get('format')!r}; "
                             f"this version reads {MANIFEST_FORMAT!r} (prepare the data again)")
        return manifest

    @property
    def vocab_size(self) -> int:
        return int(self._manifest()["tokenizer"]["vocab_size"])

    @property
    def eos_id(self) -> int:
        return int(self._manifest()["tokenizer"]["eos_id"])

    @property
    def tokenizer_path(self) -> str:
        return f"{self.data_dir}/{self._manifest()['tokenizer']['file']}"

    def _manifest(self, index: int = 0) -> dict:
        if not self.manifests:
            self.setup()
        return self.manifests[index]

    def check_vocab(self, model_vocab_size: int) -> None:
        """Refuse data whose token ids would index past the model's embedding."""
        if self.vocab_size > model_vocab_size:
            raise ValueError(f"the data in {self.data_dir} has vocab_size {self.vocab_size} (its manifest.json) but "
                             f"the model's vocab_size is {model_vocab_size}: token ids up to {self.vocab_size - 1} "
                             f"would index past the embedding; set the model's vocab_size >= {self.vocab_size}")

    def blocks(self, split: str, source: int | None = None) -> int:
        """Sequences (blocks of seq_len + 1 tokens) in a split (of one source; None: all of
        them): every chunk but the last is full."""
        if source is None:
            return sum(self.blocks(split, index) for index in range(len(self.folders)))
        manifest, block = self._manifest(source), self.seq_len + 1
        chunk, tokens = manifest["chunk_tokens"], manifest["splits"][split]["tokens"]
        return (tokens // chunk) * (chunk // block) + (tokens % chunk) // block

    def _check_seq_len(self) -> None:
        """Every folder holds whole blocks, a batch per rank of training sequences (a source
        drawn for a whole batch must fill it) and at least one validation sequence."""
        block = self.seq_len + 1
        world_size = self.trainer.world_size if self.trainer is not None else 1
        needs = {"train": self.batch_size * world_size, "val": 1}
        for index, folder in enumerate(self.folders):
            chunk = self._manifest(index)["chunk_tokens"]
            if block > chunk:
                raise ValueError(f"seq_len={self.seq_len} needs blocks of {block} tokens, larger than the chunks of "
                                 f"{folder} ({chunk} tokens); prepare it with a larger --chunk-tokens")
            for split, minimum in needs.items():
                if self.blocks(split, index) < minimum:
                    raise ValueError(f"the {split} split of {folder} holds {self.blocks(split, index)} sequences of "
                                     f"seq_len + 1 = {block} tokens; at least {minimum} are needed "
                                     f"(batch_size {self.batch_size} x {world_size} ranks for train)")

    # -- loaders --------------------------------------------------------------------

    def _dataset(self, split: str, shuffle: bool, source: int = 0) -> StreamingDataset:
        return StreamingDataset(
            input_dir=f"{self.folders[source]}/{self._manifest(source)['splits'][split]['path']}",
            item_loader=TokensLoader(block_size=self.seq_len + 1),
            shuffle=shuffle, drop_last=True, seed=self.seed, storage_options=self.storage_options)

    def train_dataloader(self) -> StreamingDataLoader | MixtureLoader:
        if self.sources is None:
            loader = StreamingDataLoader(self._dataset("train", self.shuffle), batch_size=self.batch_size,
                                         num_workers=self.num_workers, drop_last=True, collate_fn=shift_collate)
        else:
            loader = self._mixture_loader()
        if self._state_to_load is not None:
            loader.load_state_dict(self._state_to_load)
            self._state_to_load = None
        self._train_loader = loader
        return loader

    def _mixture_loader(self) -> MixtureLoader:
        loaders = [StreamingDataLoader(self._dataset("train", self.shuffle, index), batch_size=self.batch_size,
                                       num_workers=self.num_workers, drop_last=True, collate_fn=stack_collate)
                   for index in range(len(self.folders))]
        rank = self.trainer.global_rank if self.trainer is not None else 0
        self._weights_now()  # the phase this run starts in (and its note, when the weights changed)
        return MixtureLoader(loaders, self._weights_now, self.batch_size, self.seed, rank)

    def _weights_now(self) -> list[float]:
        """The shares of the current step's phase (mixture_schedule), entering it when new."""
        step = self.trainer.global_step if self.trainer is not None else 0
        sources = next(shares for start, shares in reversed(self.schedule) if start <= step)
        note = self.phases.begin(sources, step)
        if note is not None and (self.trainer is None or self.trainer.global_rank == 0):
            print(note, flush=True)
        return [source.weight for source in sources]

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        loaders = [self._val_loader(index) for index in range(len(self.folders))]
        return loaders[0] if self.sources is None else loaders

    def _val_loader(self, source: int) -> DataLoader:
        total = self.blocks("val", source)
        count = min(total, self.val_batches * self.batch_size)
        return DataLoader(FixedBlocks(self._dataset("val", False, source), count, total), batch_size=self.batch_size,
                          shuffle=False, num_workers=0, collate_fn=shift_collate)

    # -- exact resume ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self._train_loader is not None:
            state["train_loader"] = self._train_loader.state_dict()
        elif self._state_to_load is not None:
            state["train_loader"] = self._state_to_load
        if self.sources is not None:
            state["mixture"] = describe(self.sources)
            state["phases"] = self.phases.state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._check_same_sources(state_dict.get("mixture"))
        if "phases" in state_dict:
            self.phases = MixturePhases(state_dict["phases"])
        state = state_dict.get("train_loader")
        if state is None:
            return
        if self._train_loader is not None:
            self._train_loader.load_state_dict(state)
        else:
            self._state_to_load = state

    def _check_same_sources(self, saved: list[dict] | None) -> None:
        """A resume may change a mixture's weights (a new phase), not its sources."""
        names = None if self.sources is None else [source.name for source in self.sources]
        before = None if saved is None else [source["name"] for source in saved]
        if names != before:
            def said(value: list[str] | None) -> str:
                return "one folder (data.data_dir)" if value is None else f"the mixture {', '.join(value)}"
            raise ValueError(f"the checkpoint was trained on {said(before)} and this run reads {said(names)}: a "
                             "resume may change a mixture's weights, not its sources (start a new run, or "
                             "--model.init_from the checkpoint)")
