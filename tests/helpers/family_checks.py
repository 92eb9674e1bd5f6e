"""The checks every family with a transformers class passes, against a model of that class
made from a small config (tests/families/test_<family>.py call them with their maker):
``make(folder, **shape)`` saves a random model to ``folder`` and returns it (eval mode).

fp32 logits and every exit within 1e-5 with and without left padding, greedy generation
token-identical, self-speculative decoding lossless, skip sets equal transformers without
those layers, layer dropout on the kept rows only, FLOPs equal torch's counter, export ->
from_pretrained bit-identical; and the blocks under compile / activation checkpointing
train as eager.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

import framework.families.llama.blocks as llama_blocks
from framework.checkpoint import load_decoder
from framework.layer_dropout import DropPlan
from framework.flops import dense_step_flops, executed_step_flops
from tests.helpers.hf_llama import VOCAB

Maker = Callable[..., torch.nn.Module]
PROMPTS = [[5, 9, 17, 3, 44, 12, 8], [61, 2], [7, 7, 30, 90]]


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and the attention mask (1 = token) of prompts padded on the left with 0."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def logits_and_exits_equal(make: Maker, folder: Path, **shape) -> None:
    hf = make(folder, **shape)
    decoder, cfg = load_decoder(folder)
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(tokens)
    mask[1, :13] = 0
    with torch.no_grad():
        ref = hf(tokens, output_hidden_states=True)
        assert (decoder(tokens) - ref.logits).abs().max() <= 1e-5
        for k in range(1, cfg.n_layers):  # HF's last hidden state is already normed
            exit_logits = hf.lm_head(hf.model.norm(ref.hidden_states[k]))
            assert (decoder(tokens, exit_layer=k) - exit_logits).abs().max() <= 1e-5
        padded = hf(tokens, attention_mask=mask).logits
        ours = decoder(tokens, padding=mask == 0)
        assert (ours - padded)[mask.bool()].abs().max() <= 1e-5


def greedy_generation_identical(make: Maker, folder: Path) -> None:
    from eval.decoding.batch import BatchGenerator

    # A wide init: no two logits tie by rounding, so a differing token is a real difference.
    hf = make(folder, std=0.3).double()
    decoder = load_decoder(folder)[0].double()
    ids, mask = left_padded(PROMPTS)
    expected = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0,
                           eos_token_id=None)[:, ids.shape[1]:].tolist()
    ours, _ = BatchGenerator(decoder).generate(PROMPTS, 10)
    assert [t.tokens for t in ours] == expected
    alone = [BatchGenerator(decoder).generate([p], 10)[0][0].tokens for p in PROMPTS]
    assert alone == expected


def speculative_decoding_is_lossless(make: Maker, folder: Path) -> None:
    """Self-speculative decoding (a skip-set draft and an exit draft) gives transformers'
    greedy tokens on a left-padded batch."""
    from eval.decoding.drafts import ExitDraft, SkipDraft
    from eval.decoding.speculative import SelfSpeculativeDecoder

    hf = make(folder, std=0.3).double()
    decoder = load_decoder(folder)[0].double()
    ids, mask = left_padded(PROMPTS)
    expected = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
                           eos_token_id=None)[:, ids.shape[1]:].tolist()
    for draft in (SkipDraft((1, 2)), ExitDraft(2)):
        transcripts, _ = SelfSpeculativeDecoder(decoder, draft, gamma=3).generate_batch(PROMPTS, 12)
        assert [t.tokens for t in transcripts] == expected


def skip_layers_equal(make: Maker, folder: Path) -> None:
    hf = make(folder)
    decoder, _ = load_decoder(folder)
    tokens = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(3))
    layers = hf.model.layers
    hf.model.layers = torch.nn.ModuleList(layer for i, layer in enumerate(layers) if i not in (1, 2))
    hf.config.num_hidden_layers = len(hf.model.layers)
    if getattr(hf.config, "layer_types", None) is not None:  # Qwen's configs name each layer's attention
        hf.config.layer_types = hf.config.layer_types[:len(hf.model.layers)]
    try:
        with torch.no_grad():
            expected = hf(tokens, use_cache=False).logits
            assert (decoder(tokens, skip_layers=(1, 2)) - expected).abs().max() <= 1e-5
    finally:
        hf.model.layers = layers


def layer_dropout_runs_kept_rows(make: Maker, folder: Path) -> None:
    """A drop plan's logits are each row's own forward over its kept layers (branches ×
    the plan's scale), and a layer kept by no row still gets (zero) gradients."""
    make(folder)
    model = load_decoder(folder)[0].double().train()
    tokens = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(4))
    keep = [torch.tensor([1, 0, 1]).bool(), torch.zeros(3).bool(), torch.tensor([0, 1, 1]).bool(), torch.ones(3).bool()]
    logits = model(tokens, plan=DropPlan.from_masks(keep, [1.5] * 4))
    for b in range(3):
        x = tokens[b:b + 1]
        h, bias = model.embed(x), model.attention_bias(x.shape[1])
        for i, block in enumerate(model.blocks):
            if keep[i][b]:
                h = h + 1.5 * block.attn(block.attn_norm(h), bias, None)
                h = h + 1.5 * block.ffn(block.ffn_norm(h))
        assert torch.allclose(logits[b], model.logits(h)[0], atol=1e-10)
    logits.sum().backward()
    assert model.blocks[1].attn.qkv.weight.grad.abs().max() == 0


def naive_attention(q, k, v, mask):
    """Matmuls FlopCounterMode sees (it does not count CPU's fused SDPA)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask is None:
        mask = torch.full(scores.shape[-2:], float("-inf")).triu(1)
    return torch.softmax(scores + mask, dim=-1) @ v


def flops_equal_torch_counter(make: Maker, folder: Path, monkeypatch, **shape) -> None:
    monkeypatch.setattr(llama_blocks, "causal_attention", naive_attention)
    make(folder, **shape)
    model, cfg = load_decoder(folder)
    model.train()
    tokens = torch.randint(0, VOCAB, (3, 10))
    drop = DropPlan.from_masks([torch.tensor([1, 0, 1]).bool(), torch.zeros(3).bool(), torch.ones(3).bool(),
                                torch.tensor([0, 0, 1]).bool()], [1.0] * 4)
    for plan, expected in ((None, dense_step_flops(cfg, 3, 10, causal=False)),
                           (drop, executed_step_flops(cfg, drop.kept_counts(), 10, batch_size=3, causal=False))):
        with FlopCounterMode(display=False) as counter:
            model(tokens, plan=plan).sum().backward()
        assert counter.get_total_flops() == expected.total


def export_round_trip_is_bit_identical(make: Maker, folder: Path, out: Path, **shape) -> None:
    """HF folder -> ``layerdrop export --format hf`` -> from_pretrained: the same class and
    every tensor bit-identical."""
    from transformers import AutoModelForCausalLM

    from framework.checkpoint.export import main as export

    hf = make(folder, **shape)
    assert export(["--ckpt", str(folder), "--out", str(out), "--format", "hf", "--no-tokenizer"]) == 0
    back = AutoModelForCausalLM.from_pretrained(out)
    assert type(back) is type(hf)
    theirs, ours = hf.state_dict(), back.state_dict()
    assert theirs.keys() == ours.keys()
    for name in theirs:
        assert torch.equal(theirs[name], ours[name]), name


def train_steps(model: torch.nn.Module, plans: list, tokens: torch.Tensor) -> list:
    """Losses and gradients of AdamW steps on next-token cross-entropy, one per plan."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out = []
    for drop in plans:
        optimizer.zero_grad(set_to_none=False)
        logits = model(tokens[:, :-1], plan=drop)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        out.append((loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}))
        optimizer.step()
    return out


def wrapped_blocks_train_as_eager(cfg, wrap: dict) -> None:
    """The family's blocks under torch.compile or activation checkpointing
    (framework/strategies.parallelize): the losses and gradients of AdamW steps under
    changing drop plans (a layer with no kept row among them) are eager's. ``cfg``: 3 layers."""
    import copy

    from torch._dynamo.utils import counters

    from framework.families.registry import build_decoder
    from framework.strategies import parallelize

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    eager = build_decoder(cfg)
    wrapped = parallelize(copy.deepcopy(eager), **wrap)
    qkv_calls = []  # checkpointing runs a block again in backward (its first layer: the recompute stops early)
    wrapped.blocks[0].attn.qkv.register_forward_hook(lambda *_: qkv_calls.append(1))
    tokens = torch.randint(0, 50, (4, 13), generator=torch.Generator().manual_seed(1))
    plans = [None, DropPlan.from_masks([torch.tensor([1, 0, 1, 1]).bool(), torch.zeros(4).bool(),
                                        torch.ones(4).bool()], [4 / 3, 4.0, 1.0]),
             DropPlan.from_masks([torch.ones(4).bool(), torch.tensor([0, 1, 1, 0]).bool(),
                                  torch.tensor([1, 0, 0, 0]).bool()], [1.0, 2.0, 4.0])]
    for (loss, grads), (got_loss, got_grads) in zip(train_steps(eager, plans, tokens),
                                                    train_steps(wrapped, plans, tokens)):
        torch.testing.assert_close(got_loss, loss, rtol=1e-5, atol=1e-6)
        for name in grads:
            torch.testing.assert_close(got_grads[name], grads[name], rtol=1e-5, atol=1e-6, msg=name)
    if wrap.get("compile"):
        assert counters["stats"]["unique_graphs"] > 0  # the blocks did run compiled
    else:
        assert len(qkv_calls) == 2 * len(plans)
