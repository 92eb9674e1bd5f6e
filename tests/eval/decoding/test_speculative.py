"""Self-speculative decoding: lossless greedy, distribution-preserving sampling, errors.

The models are random and run in float64 with a wide init, so two different logits
never tie by rounding: any token that differs from plain greedy is a real bug.
"""

from __future__ import annotations

import copy
import json
import math
import re
import time

import pytest
import torch

from eval.adapters.exit_adapters import ExitAdapters, save_adapters
from eval.decoding.batch import BatchGenerator
from eval.decoding.drafts import ExitDraft, SkipDraft, default_draft_exit, make_draft
from eval.decoding.sampling import Sampling
from eval.decoding.speculative import AdaptiveThreshold, SelfSpeculativeDecoder, plain_decode
from eval.decoding.speedup import compare, main
from eval.decoding.transcripts import StopStrings
from framework.tokenizer import TextCodec
from framework.checkpoint import Checkpoint, export_decoder, load_decoder
from framework.model.decoder import Decoder
from tests.helpers.checkpoint_run import count_checkpoint_opens
from tests.helpers.tiny_decoder import tiny_decoder


NUM_LAYERS = 4


def tiny_model(vocab: int = 64, layers: int = NUM_LAYERS, d: int = 32, std: float = 0.3, seed: int = 0) -> Decoder:
    return tiny_decoder(seed, layers, 128, vocab_size=vocab, d_model=d, n_heads=2, std=std, multipliers=False,
                        double=True)


@pytest.fixture(scope="module")
def model() -> Decoder:
    return tiny_model()


@pytest.fixture(scope="module")
def prompts_and_references(model):
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 64, (n,), generator=gen) for n in (1, 2, 3, 5, 8, 13)]
    return [(p, plain_decode(model, p, 20)[0]) for p in prompts]


SKIP_SETS = [(), (2,), (0, 3), (1, 2, 3), (0, 1, 2)]  # nothing, one, two, all-but-one (twice)


@pytest.mark.parametrize("skip", SKIP_SETS, ids=str)
@pytest.mark.parametrize("gamma,adaptive", [(1, False), (4, False), (6, True)])
def test_skip_draft_is_token_identical_to_plain_greedy(model, prompts_and_references, skip, gamma, adaptive):
    for prompt, reference in prompts_and_references:
        controller = AdaptiveThreshold(target=0.6, threshold=0.3) if adaptive else None
        out, stats = SelfSpeculativeDecoder(model, SkipDraft(skip), gamma=gamma, adaptive=controller).generate(
            prompt, 20)
        assert out == reference, f"prompt {prompt.tolist()}"
        assert stats.accepted <= stats.drafted


@pytest.mark.parametrize("exit_layer", [1, 2, NUM_LAYERS - 1])
@pytest.mark.parametrize("gamma,adaptive", [(1, False), (5, False), (5, True)])
def test_exit_draft_is_token_identical_to_plain_greedy(model, prompts_and_references, exit_layer, gamma, adaptive):
    for prompt, reference in prompts_and_references:
        controller = AdaptiveThreshold(target=0.6, threshold=0.3) if adaptive else None
        out, _ = SelfSpeculativeDecoder(model, ExitDraft(exit_layer), gamma=gamma, adaptive=controller).generate(
            prompt, 20)
        assert out == reference, f"prompt {prompt.tolist()}"


@pytest.fixture(scope="module")
def adapters(model):
    adapters = ExitAdapters(model.config, [1, 2])
    adapters.initialise(model, "last")
    return adapters.double().eval()


@pytest.mark.parametrize("draft", ["skip:2", "skip:0,3", "exit:1", "exit:3", "adapter:2", None], ids=str)
@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_a_batch_of_prompts_of_different_lengths_is_token_identical_to_plain_greedy(
        model, prompts_and_references, adapters, draft, adaptive):
    """One padded batch; each row keeps its own accepted prefix each round."""
    prompts = [p.tolist() for p, _ in prompts_and_references]
    controller = AdaptiveThreshold(target=0.6, threshold=0.3) if adaptive else None
    decoder = SelfSpeculativeDecoder(model, make_draft(draft, NUM_LAYERS, adapters), gamma=4, adaptive=controller)
    items, stats = decoder.generate_batch(prompts, 20)
    assert [item.tokens for item in items] == [reference for _, reference in prompts_and_references]
    assert 0 < stats.rounds and stats.accepted <= stats.drafted


@pytest.mark.parametrize("slack", [0, 3])
def test_a_batch_whose_holes_run_out_of_room_is_compacted_and_stays_token_identical(
        model, prompts_and_references, monkeypatch, slack):
    """Rows that keep fewer tokens than a round's longest leave holes; with little room
    for them (none, or 3 positions) the cache compacts, mid-sequence, and no row's text moves."""
    import eval.decoding.speculative as speculative
    from framework.model.kv_cache import KVCache

    monkeypatch.setattr(speculative, "cache_positions", lambda prompt, new, gamma, rows: prompt + new + gamma + 1 + slack)
    compactions, compact = [], KVCache.compact
    monkeypatch.setattr(KVCache, "compact", lambda cache: (compactions.append(cache.length), compact(cache)))
    prompts = [p.tolist() for p, _ in prompts_and_references]
    items, stats = SelfSpeculativeDecoder(model, SkipDraft((0, 3)), gamma=4).generate_batch(prompts, 20)
    assert [item.tokens for item in items] == [reference for _, reference in prompts_and_references]
    assert compactions  # the room did run out
    assert 0 < stats.summary()["compactions"] <= len(compactions)  # counted when something moved


def test_a_batch_ends_rows_at_eos_and_stop_strings(model, prompts_and_references):
    prompts = [p.tolist() for p, _ in prompts_and_references]
    references = [r for _, r in prompts_and_references]
    eos = references[1][5]
    decode = lambda ids: "".join(chr(65 + t % 26) for t in ids)  # noqa: E731  a fake detokenizer
    stop_text = decode(references[4])[7:9]
    decoder = SelfSpeculativeDecoder(model, SkipDraft((1,)), gamma=3)
    items, _ = decoder.generate_batch(prompts, 20, eos_id=eos, stop=StopStrings([stop_text], decode))
    plain, _ = BatchGenerator(model).generate(prompts, 20, eos_id=eos, stop=StopStrings([stop_text], decode))
    assert [i.tokens for i in items] == [i.tokens for i in plain]
    assert [i.finish_reason for i in items] == [i.finish_reason for i in plain]
    assert {"eos", "stop"} <= {i.finish_reason for i in items}


def test_the_default_draft_and_draft_specs(adapters):
    assert default_draft_exit(6) == 2 and default_draft_exit(13) == 4 and default_draft_exit(2) == 1
    assert default_draft_exit(12, [3, 6, 9]) == 3
    draft = make_draft(None, NUM_LAYERS, adapters)
    assert isinstance(draft, ExitDraft) and draft.kind == "adapter" and draft.exit_layer == 1
    assert make_draft("skip:1-2", NUM_LAYERS).skip_layers == (1, 2)
    with pytest.raises(ValueError, match="draft 'jump:2' is invalid: allowed: exit:E"):
        make_draft("jump:2", NUM_LAYERS)
    with pytest.raises(ValueError, match=r"the adapters have exits \[1, 2\]"):
        make_draft("adapter:3", NUM_LAYERS, adapters)


def test_empty_skip_set_accepts_every_draft_token(model, prompts_and_references):
    prompt, reference = prompts_and_references[3]
    out, stats = SelfSpeculativeDecoder(model, SkipDraft(()), gamma=4).generate(prompt, 20)
    assert out == reference
    assert stats.accepted == stats.drafted > 0
    assert stats.rounds == math.ceil(19 / 5)  # 4 drafted + 1 from the verifier per round


def test_verification_is_one_full_forward_per_round(model, prompts_and_references, monkeypatch):
    full_calls = []
    step = model.step

    def count(inputs, cache, **kwargs):  # every forward of a route is one Decoder.step
        if kwargs.get("layers") is None:
            full_calls.append(inputs.shape[1])
        return step(inputs, cache, **kwargs)

    monkeypatch.setattr(model, "step", count)
    prompt, reference = prompts_and_references[4]
    out, stats = SelfSpeculativeDecoder(model, SkipDraft((1, 2)), gamma=3).generate(prompt, 20)
    monkeypatch.undo()
    assert out == reference
    assert len(full_calls) == 1 + stats.rounds  # the prefill, then one verify per round
    assert full_calls[0] == len(prompt)
    assert sum(n - 1 for n in full_calls[1:]) == stats.drafted  # each verify scores pending + drafts


def test_adaptive_threshold_moves_toward_the_target():
    controller = AdaptiveThreshold(target=0.8, threshold=0.5, step=0.1, momentum=0.0)
    controller.update(accepted=1, drafted=4)  # 25% < 80%: draft less
    assert controller.threshold == pytest.approx(0.6)
    controller.update(accepted=4, drafted=4)  # 100% > 80%: draft more
    assert controller.threshold == pytest.approx(0.5)
    assert controller.stop(0.4) and not controller.stop(0.6)


def test_adaptive_drafting_stops_on_low_confidence(model, prompts_and_references):
    prompt, _ = prompts_and_references[2]
    always_stop = AdaptiveThreshold(target=0.99, threshold=0.999, step=0.0)
    _, stats = SelfSpeculativeDecoder(model, SkipDraft((3,)), gamma=5, adaptive=always_stop).generate(prompt, 12)
    assert stats.drafted == stats.rounds  # one token per round, then the threshold stops it


# ----------------------------------------------------------------- sampling


def _joint_second_third(model: Decoder, prompt: torch.Tensor, skip: tuple[int, ...] | None) -> torch.Tensor:
    """Exact P(t2, t3) [V, V] where t1 ~ full model and t2, t3 ~ the full model
    (skip=None) or the draft with ``skip`` (the distribution a broken sampler yields)."""
    vocab = model.config.vocab_size

    def next_probs(seq: torch.Tensor, layers: tuple[int, ...]) -> torch.Tensor:
        return torch.softmax(model(seq.view(1, -1), skip_layers=layers)[0, -1], -1)

    layers = skip or ()
    joint = torch.zeros(vocab, vocab, dtype=torch.float64)
    with torch.inference_mode():
        p1 = next_probs(prompt, ())
        for t1 in range(vocab):
            seq1 = torch.cat([prompt, torch.tensor([t1])])
            p2 = next_probs(seq1, layers)
            for t2 in range(vocab):
                p3 = next_probs(torch.cat([seq1, torch.tensor([t2])]), layers)
                joint[t2] += p1[t1] * p2[t2] * p3
    return joint


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic with cells of expected count < 5 pooled; (X², degrees of freedom)."""
    n = counts.sum()
    expected = probs.flatten() * n
    counts = counts.flatten().double()
    small = expected < 5
    stat = float(((counts[~small] - expected[~small]) ** 2 / expected[~small]).sum())
    cells = int((~small).sum())
    if small.any():
        stat += float((counts[small].sum() - expected[small].sum()) ** 2 / expected[small].sum())
        cells += 1
    return stat, cells - 1


def _critical_value(dof: int, z: float = 3.719) -> float:
    """Upper 1e-4 quantile of χ²(dof), Wilson–Hilferty approximation."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


@pytest.fixture(scope="module")
def sampling_setup():
    model = tiny_model(vocab=8, layers=2, d=16, std=0.6, seed=3)
    skip, prompt = (1,), torch.tensor([1, 5, 2])
    exact, drafty = _joint_second_third(model, prompt, None), _joint_second_third(model, prompt, skip)
    assert 0.5 * float((exact - drafty).abs().sum()) > 0.15  # the draft really is a different model
    return model, skip, prompt, exact, drafty


@pytest.mark.parametrize("batched", [False, True], ids=["one_by_one", "one_batch"])
def test_sampling_preserves_the_full_models_distribution(sampling_setup, batched):
    """Samples of (t2, t3): one sequence at a time (round 1 drafts t2, t3: a rejection at
    either, or a bonus token), or all in one batch (each row its own stream, seeded by
    its position: the prompts are all the same). The draft's own distribution is ~100
    times the critical value away at 800 samples."""
    model, skip, prompt, exact, drafty = sampling_setup
    runs = 3000 if batched else 800
    if batched:
        decoder = SelfSpeculativeDecoder(model, SkipDraft(skip), gamma=2, temperature=1.0, seed=0,
                                         seed_by="position")
        items, stats = decoder.generate_batch([prompt.tolist()] * runs, 4)
        outputs, rejected = [item.tokens for item in items], stats.drafted - stats.accepted
    else:
        gen = torch.Generator().manual_seed(0)
        decoder = SelfSpeculativeDecoder(model, SkipDraft(skip), gamma=2, temperature=1.0, generator=gen)
        outputs, rejected = [], 0
        for _ in range(runs):
            out, stats = decoder.generate(prompt, 4)
            outputs.append(out)
            rejected += stats.drafted - stats.accepted
    counts = torch.zeros(8, 8)
    for out in outputs:
        counts[out[1], out[2]] += 1
    assert rejected > runs // 10  # the rejection-and-resample branch ran many times
    stat, dof = _chi_square(counts, exact)
    assert stat < _critical_value(dof), f"χ²={stat:.1f} on {dof} dof against the full model"
    stat_draft, dof_draft = _chi_square(counts, drafty)
    assert stat_draft > _critical_value(dof_draft), "the test cannot tell the draft's distribution apart"


@pytest.mark.parametrize("draft", ["skip:1,2", "exit:1", "adapter:2"])
def test_a_prompts_sampled_text_is_the_same_alone_and_in_any_batch(model, prompts_and_references, adapters, draft):
    """Each row keeps its own accepted prefix and draws only for its own drafts."""
    prompts = [p.tolist() for p, _ in prompts_and_references]
    decoder = SelfSpeculativeDecoder(model, make_draft(draft, NUM_LAYERS, adapters), gamma=3,
                                     sampling=Sampling(temperature=1.0), seed=11)
    batched, stats = decoder.generate_batch(prompts, 17)
    assert stats.drafted > stats.accepted > 0  # rows were rejected at different places
    for prompt, item in zip(prompts, batched):
        assert decoder.generate_batch([prompt], 17)[0][0].tokens == item.tokens
    pairs, _ = decoder.generate_batch(prompts[3:5], 17)
    assert [i.tokens for i in pairs] == [i.tokens for i in batched[3:5]]


@pytest.mark.parametrize("draft", ["skip:1,2", "exit:1", "exit:3", "adapter:2"])
def test_layers_per_token_counts_the_blocks_that_ran(model, prompts_and_references, adapters, draft, monkeypatch):
    """Σ over every block call of the positions it ran, less the prompt's prefill (the
    first token is charged L, the forward of the prompt's last position)."""
    prompt, _ = prompts_and_references[4]
    ran = []
    blocks = list(model.blocks) + list(adapters.blocks.values())
    hooks = [block.register_forward_hook(lambda module, args, out: ran.append(out.shape[1])) for block in blocks]
    try:
        decoder = SelfSpeculativeDecoder(model, make_draft(draft, NUM_LAYERS, adapters), gamma=3)
        _, stats = decoder.generate(prompt, 16)
    finally:
        for hook in hooks:
            hook.remove()
    prefill = len(prompt) * (NUM_LAYERS + (draft.startswith("adapter")))
    assert stats.block_evaluations == pytest.approx(sum(ran) - prefill + NUM_LAYERS)


# --------------------------------------------------------------- reporting/CLI


def test_compare_reports_the_fixed_keys(model, prompts_and_references):
    prompts = [p for p, _ in prompts_and_references[:2]]
    report = compare(model, SkipDraft((1,)), prompts, max_new_tokens=8, gamma=3, repeats=1, warmup=0)
    for key in ("speedup", "acceptance_rate", "draft_time_ratio", "identical_to_greedy", "skip_layers",
                "tokens_per_s", "compactions"):
        assert key in report
    assert report["identical_to_greedy"] is True
    assert report["skip_layers"] == [1]
    assert 0.0 <= report["acceptance_rate"] <= 1.0 and report["speedup"] > 0


def test_a_rounds_time_is_split_into_its_parts_with_nothing_counted_twice(model, prompts_and_references,
                                                                          monkeypatch):
    """The breakdown of #44 item 3: prefill, draft, verify, bookkeeping and the rest sum to the run's
    wall time; a slowed verifying forward shows up under verify, and only there."""
    from eval.decoding.speculative import SelfSpeculativeDecoder

    prompts = [p.tolist() for p, _ in prompts_and_references[:3]]
    decoder = SelfSpeculativeDecoder(model, ExitDraft(2), gamma=3)
    _, stats = decoder.generate_batch(prompts, 8)
    shares = stats.summary()["time_shares"]
    assert set(shares) == {"prefill", "draft", "verify", "bookkeeping", "between_rounds"}
    assert all(value >= 0 for value in shares.values()) and sum(shares.values()) == pytest.approx(1.0)
    verify = ExitDraft.verify

    def slow_verify(self, *args, **kwargs):
        time.sleep(0.02)
        return verify(self, *args, **kwargs)

    monkeypatch.setattr(ExitDraft, "verify", slow_verify)
    _, slowed = decoder.generate_batch(prompts, 8)
    assert slowed.verify_seconds >= 0.02 * slowed.rounds
    assert slowed.draft_seconds + slowed.bookkeeping_seconds < 0.02 * slowed.rounds
    assert slowed.summary()["time_shares"]["verify"] > shares["verify"]


@pytest.mark.parametrize("draft,message", [
    (SkipDraft((4,)), "skip_layers=[4] is invalid"),
    (SkipDraft((-1,)), "skip_layers=[-1] is invalid"),
    (ExitDraft(0), "exit_layer=0 is invalid"),
    (ExitDraft(NUM_LAYERS), f"exit_layer={NUM_LAYERS} is invalid"),
])
def test_bad_drafts_are_refused(model, draft, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SelfSpeculativeDecoder(model, draft)


@pytest.mark.parametrize("gamma", [0, -2, 1.5])
def test_gamma_below_one_is_refused(model, gamma):
    with pytest.raises(ValueError, match="gamma=.* is invalid"):
        SelfSpeculativeDecoder(model, SkipDraft(()), gamma=gamma)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, model):
    root = tmp_path_factory.mktemp("spec")
    export_decoder(copy.deepcopy(model).float(), root / "model")
    (root / "prompts.json").write_text(json.dumps([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]))
    return root


def test_cli_writes_the_report(exported, capsys, monkeypatch):
    out = exported / "run.json"
    opened = count_checkpoint_opens(monkeypatch)
    assert main(["--ckpt", str(exported / "model"), "--skip-layers", "1,2", "--prompts",
                 str(exported / "prompts.json"), "--max-new-tokens", "10", "--repeats", "1", "--out", str(out)]) == 0
    assert opened == [exported / "model"]  # opened and proven once for the whole command
    report = json.loads(out.read_text())
    assert report["skip_layers"] == [1, 2] and report["draft"] == "skip"
    assert report["identical_to_greedy"] is True
    model, _ = load_decoder(exported / "model")
    for prompt, row in zip(json.loads((exported / "prompts.json").read_text()), report["outputs"]):
        assert row["prompt"] == prompt and row["tokens"] == plain_decode(model, prompt, 10)[0]
    assert "speedup" in capsys.readouterr().out


def test_cli_takes_text_prompts_and_adapters(tmp_path, capsys):
    from tiny_lm import export_tiny_model

    folder = export_tiny_model(tmp_path / "model", seed=1)
    backbone, _ = load_decoder(folder)
    adapters = ExitAdapters(backbone.config, [1])
    adapters.initialise(backbone, "last")
    save_adapters(adapters, tmp_path / "adapters", {"model": backbone.config.to_dict()})
    out = tmp_path / "run.json"
    assert main(["--ckpt", str(folder), "--prompt", "Snow is", "--prompt", "The sun rises in the",
                 "--adapters", str(tmp_path / "adapters"), "--max-new-tokens", "8", "--repeats", "1",
                 "--batch-size", "2", "--device", "cpu", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["draft"] == "adapter" and report["exit_layer"] == 1 and report["identical_to_greedy"] is True
    codec = TextCodec.for_checkpoint(Checkpoint.open(folder))
    for text, row in zip(["Snow is", "The sun rises in the"], report["outputs"]):
        items, _ = BatchGenerator(backbone).generate([codec.encode_prompt(text)], 8, eos_id=codec.eos_id)
        assert row["prompt"] == text and row["tokens"] == items[0].tokens and row["text"] == codec.decode(row["tokens"])


def test_cli_names_an_empty_prompts_file_before_loading_the_model(exported, tmp_path, capsys, monkeypatch):
    import framework.checkpoint

    monkeypatch.setattr(framework.checkpoint, "load_decoder", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(SystemExit):
        main(["--ckpt", str(exported / "model"), "--prompts", str(tmp_path / "empty.json"), "--out",
              str(tmp_path / "r.json")])
    assert f"--prompts '{tmp_path / 'empty.json'}' is empty" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--skip-layers", "1,9"], "layers [9] are outside 0..3"),
    (["--exit-layer", "4"], "exit_layer=4 is invalid"),
    (["--skip-layers", "1", "--gamma", "0"], "--gamma=0 is invalid"),
    (["--skip-layers", "1", "--ckpt", "/nonexistent/model.ckpt"], "does not exist"),
    (["--skip-layers", "1", "--threshold", "0.3"], "--threshold is for --adaptive only"),
    (["--skip-layers", "1", "--target-acceptance", "0.5"], "--target-acceptance is for --adaptive only"),
])
def test_cli_errors_are_one_line(exported, capsys, args, message):
    base = ["--ckpt", str(exported / "model"), "--prompts", str(exported / "prompts.json"),
            "--out", str(exported / "never.json")]
    with pytest.raises(SystemExit) as exit_info:
        main(base + args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "error:" in err
    assert not (exported / "never.json").exists()
