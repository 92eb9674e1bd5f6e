"""TokenDataModule over data.mixture: weighted draws tagged by source, per-source val sets,
exact resume, a resume with new weights, and the refusals before a batch is drawn."""

import hashlib
import itertools
import os
import sysconfig
from pathlib import Path

import lightning as L
import pytest
import torch

from data_prep.prepare import main as prepare
from framework.training.data import TokenDataModule

SEQ, BATCH = 32, 4


@pytest.fixture(scope="module")
def sources(mixture_sources) -> dict[str, str]:
    return mixture_sources


def _mixture(sources, email=0.75, http=0.25):
    return {"email": {"dir": sources["email"], "weight": email}, "http": {"dir": sources["http"], "weight": http}}


def _module(sources, **overrides) -> TokenDataModule:
    settings = dict(mixture=_mixture(sources), seq_len=SEQ, batch_size=BATCH, seed=3, val_batches=3)
    module = TokenDataModule(**{**settings, **overrides})
    module.setup("fit")
    return module


def _rows(loader, limit):
    """(source, block) of every sequence of the first ``limit`` batches."""
    rows = []
    for inputs, targets, source in itertools.islice(loader, limit):  # never draws batch limit + 1
        full = torch.cat([inputs, targets[:, -1:]], dim=1)
        rows += [(int(s), tuple(row.tolist())) for s, row in zip(source, full)]
    return rows


def test_batches_carry_each_rows_source(sources):
    module = _module(sources)
    inputs, targets, source = next(iter(module.train_dataloader()))
    assert inputs.shape == targets.shape == (BATCH, SEQ) and source.shape == (BATCH,)
    assert source.dtype == torch.int64 and set(source.tolist()) <= {0, 1}
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


def test_rows_come_from_their_source(sources):
    """A row tagged 'http' is a block of the http folder, not of the other."""
    rows = _rows(_module(sources).train_dataloader(), limit=20)
    singles = {name: set(_rows_single(folder)) for name, folder in sources.items()}
    for source, block in rows:
        assert block in singles[("email", "http")[source]]


def _rows_single(folder):
    module = TokenDataModule(folder, seq_len=SEQ, batch_size=BATCH, seed=3, shuffle=False)
    module.setup()
    return [tuple(torch.cat([i, t[:, -1:]], dim=1)[r].tolist()) for i, t in module.train_dataloader()
            for r in range(BATCH)]


@pytest.mark.parametrize("weights", [(0.75, 0.25), (0.3, 0.7)])
def test_the_share_of_each_source_is_its_weight_within_3_standard_errors(sources, weights):
    rows = _rows(_module(sources, mixture=_mixture(sources, *weights)).train_dataloader(), limit=250)
    n = len(rows)
    share = sum(source == 0 for source, _ in rows) / n
    assert n == 250 * BATCH
    assert abs(share - weights[0]) < 3 * (weights[0] * (1 - weights[0]) / n) ** 0.5


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_resumes_exactly(sources, num_workers):
    uninterrupted = _rows(_module(sources, num_workers=num_workers).train_dataloader(), limit=10)
    first = _module(sources, num_workers=num_workers)
    loader = first.train_dataloader()
    assert _rows(loader, limit=5) == uninterrupted[:5 * BATCH]
    state = first.state_dict()
    resumed = _module(sources, num_workers=num_workers)
    resumed.load_state_dict(state)
    assert _rows(resumed.train_dataloader(), limit=5) == uninterrupted[5 * BATCH:]


def test_a_resume_with_other_weights_continues_each_source_and_opens_a_phase(sources, capsys):
    first = _module(sources)
    before = _rows(first.train_dataloader(), limit=6)
    state = first.state_dict()
    annealed = _module(sources, mixture=_mixture(sources, 0.1, 0.9))
    annealed.load_state_dict(state)
    after = _rows(annealed.train_dataloader(), limit=40)
    assert "data mixture: new weights from step 0 (phase 2): email 0.750 -> 0.100, http 0.250 -> 0.900" \
        in capsys.readouterr().out
    assert sum(source == 1 for source, _ in after) > 0.75 * len(after)
    # each source continues where it stopped: no block of the first phase comes again
    assert not {row for row in after} & {row for row in before}
    assert [phase["weights"] for phase in annealed.state_dict()["phases"]] == [
        {"email": 0.75, "http": 0.25}, {"email": 0.1, "http": 0.9}]


def test_validation_is_one_fixed_spread_set_per_source(sources):
    module = _module(sources)
    loaders = module.val_dataloader()
    assert len(loaders) == 2
    for index, loader in enumerate(loaders):
        first = [batch[0].clone() for batch in loader]
        again = [batch[0] for batch in loader]
        assert all(torch.equal(a, b) for a, b in zip(first, again))
        assert sum(len(batch) for batch in first) == min(module.blocks("val", index), 3 * BATCH)


def test_a_missing_folder_is_named(sources, tmp_path):
    mixture = {**_mixture(sources), "gone": {"dir": str(tmp_path / "gone"), "weight": 1}}
    with pytest.raises(FileNotFoundError, match="no manifest.json in .*gone"):
        _module(sources, mixture=mixture)


def test_sources_from_two_tokenizers_are_refused(sources, tmp_path):
    other = tmp_path / "other"
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    assert prepare(["--files", str(stdlib / "http" / "*.py"), "--tokenizer", "train", "--vocab-size", "300",
                    "--max-tokens", "30k", "--chunk-tokens", "8192", "--workers", "1", "--no-progress",
                    "--out", str(other)]) == 0
    mixture = {**_mixture(sources), "other": {"dir": str(other), "weight": 1}}
    with pytest.raises(ValueError, match="data.mixture.other .* another tokenizer"):
        _module(sources, mixture=mixture)


def test_a_source_that_cannot_fill_a_batch_or_has_no_val_is_refused(sources):
    with pytest.raises(ValueError, match="the val split of .* holds 0 sequences"):
        _module(sources, seq_len=8191)  # blocks of 8192 tokens: the small val splits hold none
    with pytest.raises(ValueError, match="the train split of .*http holds .* at least 2000 are needed"):
        _module(sources, batch_size=2000)  # email holds 3,024, http fewer


def test_data_dir_and_mixture_are_exclusive(sources):
    with pytest.raises(ValueError, match="exactly one of them"):
        TokenDataModule(sources["email"], mixture=_mixture(sources))
    with pytest.raises(ValueError, match="exactly one of them"):
        TokenDataModule()


def test_a_resume_cannot_change_the_sources(sources):
    state = _module(sources).state_dict()
    single = TokenDataModule(sources["email"], seq_len=SEQ, batch_size=BATCH)
    with pytest.raises(ValueError, match="trained on the mixture email, http and this run reads one folder"):
        single.load_state_dict(state)


class _Recorder(L.LightningModule):
    """Trains one weight and records a fingerprint of every batch it sees."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[str] = []

    def training_step(self, batch, batch_idx):
        inputs, _, source = batch
        self.seen.append(hashlib.sha1(inputs.numpy().tobytes() + source.numpy().tobytes()).hexdigest())
        return (self.weight * inputs.float().mean()).sum()

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(sources, max_steps, ckpt_dir=None, ckpt_path=None, num_workers=0):
    model = _Recorder()
    callbacks = [L.pytorch.callbacks.ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=3, save_top_k=-1)]
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks if ckpt_dir else [],
                        enable_checkpointing=ckpt_dir is not None, val_check_interval=2, num_sanity_val_steps=0)
    data = TokenDataModule(mixture=_mixture(sources), seq_len=SEQ, batch_size=BATCH, seed=3, val_batches=2,
                           num_workers=num_workers)
    trainer.fit(model, data, ckpt_path=ckpt_path)
    return model.seen


@pytest.mark.parametrize("num_workers", [0, 2])
def test_trainer_checkpoint_resumes_exactly(sources, tmp_path, num_workers):
    """Through Lightning: stop at step 3, resume from the checkpoint, the same batches as one run
    (Lightning would prefetch a batch from a loader without a length: MixtureLoader has one)."""
    uninterrupted = _fit(sources, max_steps=7, num_workers=num_workers)
    before = _fit(sources, max_steps=3, ckpt_dir=str(tmp_path), num_workers=num_workers)
    (checkpoint,) = os.listdir(tmp_path)
    after = _fit(sources, max_steps=7, ckpt_path=str(tmp_path / checkpoint), num_workers=num_workers)
    assert before + after == uninterrupted and len(set(uninterrupted)) == 7
