"""TokenDataModule: batches, the fixed val set, manifest checks, exact resume, ranks."""

import hashlib
import itertools
import os
from collections import Counter

import lightning as L
import pytest
import torch
from litdata.utilities.env import _DistributedEnv

from data_prep.chunks import read_split_tokens
from framework.training.data import TokenDataModule

SEQ, BATCH = 32, 4


@pytest.fixture(scope="module")
def data_dir(prepared_tokens) -> str:
    """The suite's prepared tokens (tests/conftest.py): ~200k tokens of real code, vocab
    300, in chunks of 8192 tokens."""
    return str(prepared_tokens)


def _module(data_dir, **overrides) -> TokenDataModule:
    settings = dict(seq_len=SEQ, batch_size=BATCH, seed=3, val_batches=3)
    module = TokenDataModule(data_dir, **{**settings, **overrides})
    module.setup("fit")
    return module


def _blocks(loader, limit=None):
    """Every sequence the loader yields, as tuples of its seq_len + 1 tokens."""
    found = []
    for inputs, targets in itertools.islice(loader, limit):  # never draws batch limit + 1
        full = torch.cat([inputs, targets[:, -1:]], dim=1)
        found += [tuple(row.tolist()) for row in full]
    return found


def _reference_blocks(data_dir, split):
    """The split's blocks straight from the chunk files: blocks never straddle a chunk."""
    tokens = read_split_tokens(os.path.join(data_dir, split), "uint16")
    blocks = []
    for start in range(0, len(tokens), 8192):
        chunk = tokens[start:start + 8192]
        blocks += [tuple(chunk[i:i + SEQ + 1].tolist()) for i in range(0, len(chunk) - SEQ, SEQ + 1)]
    return blocks


def test_batches_are_shifted_int64_pairs(data_dir):
    module = _module(data_dir)
    inputs, targets = next(iter(module.train_dataloader()))
    assert inputs.shape == targets.shape == (BATCH, SEQ)
    assert inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert int(inputs.max()) < module.vocab_size == 300 and module.eos_id == 0


def test_one_epoch_serves_every_block_once(data_dir):
    module = _module(data_dir)
    reference = _reference_blocks(data_dir, "train")
    assert module.blocks("train") == len(reference)
    served = _blocks(module.train_dataloader())
    assert len(served) == len(reference) // BATCH * BATCH  # drop_last
    assert not Counter(served) - Counter(reference)


def test_shuffle_depends_on_the_seed(data_dir):
    first = _blocks(_module(data_dir, seed=3).train_dataloader(), limit=3)
    assert first == _blocks(_module(data_dir, seed=3).train_dataloader(), limit=3)
    assert first != _blocks(_module(data_dir, seed=4).train_dataloader(), limit=3)


def test_val_set_is_fixed_capped_spread_over_the_split_and_in_order(data_dir):
    module = _module(data_dir, val_batches=3)
    loader = module.val_dataloader()
    served = _blocks(loader)
    reference = _reference_blocks(data_dir, "val")
    step = len(reference) / (3 * BATCH)
    assert step > 2  # the fixture's val split is much larger than the val set
    expected = [reference[int(i * len(reference) // (3 * BATCH))] for i in range(3 * BATCH)]
    assert len(loader) == 3 and served == expected
    assert served[-1] in reference[len(reference) // 2:]  # from the whole split, not a prefix
    assert _blocks(module.val_dataloader()) == served


def test_a_val_set_larger_than_the_split_is_the_whole_split(data_dir):
    module = _module(data_dir, val_batches=10**6)
    assert _blocks(module.val_dataloader()) == _reference_blocks(data_dir, "val")


def test_missing_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no manifest.json in .*layerdrop prepare"):
        TokenDataModule(str(tmp_path), seq_len=SEQ).setup("fit")


def test_vocab_larger_than_the_model_is_a_clear_error(data_dir):
    with pytest.raises(ValueError, match="has vocab_size 300 .* the model's vocab_size is 256"):
        _module(data_dir, model_vocab_size=256)
    module = _module(data_dir, model_vocab_size=300)
    with pytest.raises(ValueError, match="vocab_size 300 .* vocab_size is 299"):
        module.check_vocab(299)


def test_sequences_that_do_not_fit_are_refused(data_dir):
    with pytest.raises(ValueError, match="larger than the chunks .* --chunk-tokens"):
        _module(data_dir, seq_len=9000)
    with pytest.raises(ValueError, match="train split .* at least 100000 are needed"):
        _module(data_dir, batch_size=100_000)


@pytest.mark.parametrize("bad", [dict(seq_len=0), dict(batch_size=-1), dict(val_batches=1.5), dict(num_workers=-1)])
def test_invalid_settings(data_dir, bad):
    with pytest.raises(ValueError, match=f"{next(iter(bad))}="):
        TokenDataModule(data_dir, **bad)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_resumes_exactly(data_dir, num_workers):
    uninterrupted = _blocks(_module(data_dir, num_workers=num_workers).train_dataloader(), limit=10)

    first = _module(data_dir, num_workers=num_workers)
    loader = first.train_dataloader()
    assert _blocks(loader, limit=5) == uninterrupted[:5 * BATCH]
    state = first.state_dict()

    resumed = _module(data_dir, num_workers=num_workers)
    resumed.load_state_dict(state)
    assert _blocks(resumed.train_dataloader(), limit=5) == uninterrupted[5 * BATCH:]


def test_two_ranks_are_disjoint_and_cover_the_split(data_dir):
    """litdata's distributed environment, simulated for ranks 0 and 1 of 2."""
    everything = Counter(_reference_blocks(data_dir, "train"))
    per_rank = []
    for rank in range(2):
        loader = _module(data_dir).train_dataloader()
        loader.dataset.distributed_env = _DistributedEnv(world_size=2, global_rank=rank, num_nodes=1)
        per_rank.append(Counter(_blocks(loader)))
    served = per_rank[0] + per_rank[1]
    assert sum(per_rank[0].values()) == sum(per_rank[1].values()) > 0  # same number of steps
    assert not served - everything  # no block twice (on one rank or on both)
    # drop_last: only what does not fill a batch on every rank is left out
    assert sum(everything.values()) - sum(served.values()) < 2 * BATCH


def test_streams_from_a_url(data_dir):
    """The object-store code path (litdata's local: scheme), manifest included."""
    module = _module("local:" + data_dir)
    assert module.vocab_size == 300
    assert _blocks(module.train_dataloader(), limit=2) == _blocks(_module(data_dir).train_dataloader(), limit=2)


class _Recorder(L.LightningModule):
    """Trains one weight and records a fingerprint of every batch it sees."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[str] = []

    def training_step(self, batch, batch_idx):
        inputs, _ = batch
        self.seen.append(hashlib.sha1(inputs.numpy().tobytes()).hexdigest())
        return (self.weight * inputs.float().mean()).sum()

    def validation_step(self, batch, batch_idx):
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(data_dir, max_steps, ckpt_dir=None, ckpt_path=None):
    model = _Recorder()
    callbacks = [L.pytorch.callbacks.ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=3, save_top_k=-1)]
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks if ckpt_dir else [],
                        enable_checkpointing=ckpt_dir is not None, val_check_interval=2, num_sanity_val_steps=0)
    trainer.fit(model, TokenDataModule(data_dir, seq_len=SEQ, batch_size=BATCH, seed=3, val_batches=2),
                ckpt_path=ckpt_path)
    return model.seen


def test_trainer_checkpoint_resumes_exactly(data_dir, tmp_path):
    """Through Lightning: stop at step 3, resume from the checkpoint, same batches as one run."""
    uninterrupted = _fit(data_dir, max_steps=7)
    before = _fit(data_dir, max_steps=3, ckpt_dir=str(tmp_path))
    (checkpoint,) = os.listdir(tmp_path)
    saved = torch.load(tmp_path / checkpoint, weights_only=False)
    assert saved["TokenDataModule"]["train_loader"]["num_samples_yielded"] == 3 * BATCH
    after = _fit(data_dir, max_steps=7, ckpt_path=str(tmp_path / checkpoint))
    assert before + after == uninterrupted and len(set(uninterrupted)) == 7
