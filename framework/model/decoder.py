"""The Celerity-style decoder: pre-LN blocks of ALiBi attention and a squared-ReLU FFN.

Single-device and unaware of ranks: data/tensor parallelism, activation checkpointing
and compilation are applied from outside (framework/strategies/parallelize.py).
"""

from __future__ import annotations

import numbers
import re
from typing import Callable, Iterable, Mapping, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from framework.model.attention import alibi_causal_bias, alibi_slopes, flex_attention, sdpa_attention
from framework.config import ModelConfig
from framework.model.kv_cache import KVCache
from framework.model.static_kv_cache import StaticKVCache
from framework.layer_dropout import DropPlan, LayerDrop, residual_update


# Table A.2's parameter groups: a decoder says which group each of its parameters is in
# (``Decoder.parameter_groups``); framework/training/parametrization.py gives each group its
# init, learning rate, AdamW ε and weight decay.
HIDDEN = "hidden"  # the blocks' weight matrices
NORMS_AND_BIASES = "norms_and_biases"  # the blocks' norms and biases
EMBEDDING = "embedding"
FINAL_NORM = "final_norm"
UNEMBEDDING = "unembedding"
# Name segments that wrappers insert (torch.compile, activation checkpointing, FSDP1).
_WRAPPER_SEGMENT = re.compile(r"(^|\.)(_orig_mod|_checkpoint_wrapped_module|_fsdp_wrapped_module)(?=\.)")


def plain_name(name: str) -> str:
    """A Decoder parameter or buffer name without the segments wrappers insert: the name
    ``parameter_groups`` and every checkpoint use."""
    plain = _WRAPPER_SEGMENT.sub("", name)
    return plain[1:] if plain.startswith(".") else plain


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.attn_dim, bias=cfg.bias)
        self.proj = nn.Linear(cfg.attn_dim, cfg.d_model, bias=cfg.bias)
        self.register_buffer("slopes", alibi_slopes(cfg.n_heads), persistent=False)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None, cache: KVCache | None,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """Every row's K/V goes to the cache; with ``rows`` only those rows' queries run."""
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k, v = cache.update(self.layer_index, k, v)
        if rows is not None:
            q, k, v = q[rows], k[rows], v[rows]
            bias = bias[rows] if bias is not None and bias.shape[0] > 1 else bias
        if bias is None:
            out = flex_attention(q, k, v, self.slopes)
        else:
            out = sdpa_attention(q, k, v, bias)
        return self.proj(out.transpose(1, 2).reshape(q.shape[0], seq, self.n_heads * self.head_dim))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.bias)
        self.down = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.relu(self.up(x)).square())


class Block(nn.Module):
    """Pre-LN block. With a ``LayerDrop`` each branch runs on its kept rows only."""

    ffn_matrices = 2  # the FFN's d×f weight matrices (up, down), for framework/flops.py

    def __init__(self, cfg: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.attn_norm = self.new_norm(cfg)
        self.attn = self.new_attention(cfg, layer_index)
        self.ffn_norm = self.new_norm(cfg)
        self.ffn = self.new_ffn(cfg)
        # CompleteP's 1/m_L; the layer-density part (1/ρ) comes with the drop plan.
        self.residual_multiplier = cfg.residual_multiplier

    # The parts a model family (framework/families) replaces; the residual logic stays.
    @staticmethod
    def new_norm(cfg: ModelConfig) -> nn.Module:
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)

    @staticmethod
    def new_attention(cfg: ModelConfig, layer_index: int) -> nn.Module:
        return Attention(cfg, layer_index)

    @staticmethod
    def new_ffn(cfg: ModelConfig) -> nn.Module:
        return FeedForward(cfg)

    @staticmethod
    def activation_bytes_per_token(cfg: ModelConfig, mixed: bool) -> int:
        """Bytes one block saves for backward per token (framework/recipes/device_memory.py's
        activation term), e = 2 under bf16-mixed, 4 under 32-true: each LayerNorm's
        residual input (fp32) and its output (8d + 2e·d), q/k/v, the attention output
        and its copy (5e·a), the FFN's ReLU output and its square (2e·f)."""
        e = 2 if mixed else 4
        d, a, f = cfg.d_model, cfg.attn_dim, cfg.ffn_dim
        return 8 * d + 2 * e * d + 5 * e * a + 2 * e * f

    def parameter_groups(self) -> dict[str, str]:
        """Parameter name (within the block) -> its Table A.2 group: a linear layer's weight is
        hidden, its bias and every parameter of a norm (a module of the ``new_norm`` class,
        wherever in the block) are norms and biases. A family whose block holds another kind
        of parameter declares it here; one left out is refused by the parametrization."""
        norm = type(self.attn_norm)
        groups = {}
        for prefix, module in self.named_modules():
            for name, _ in module.named_parameters(recurse=False):
                if isinstance(module, nn.Linear) or isinstance(module, norm):
                    hidden = isinstance(module, nn.Linear) and name == "weight"
                    groups[f"{prefix}.{name}" if prefix else name] = HIDDEN if hidden else NORMS_AND_BIASES
        return groups

    def forward(self, h: torch.Tensor, bias: torch.Tensor | None, drop: LayerDrop | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        """h plus each branch on the rows ``drop`` keeps (every row without one), scaled by
        CompleteP's 1/m_L times ``drop.scale``: training's layer dropout, and decoding's
        rows that left at an early exit (``Decoder.step``). With a ``cache`` every row
        writes this layer's K/V from its current state, kept or not (CALM's state
        propagation), and the kept rows' queries alone run."""
        drop = drop or LayerDrop(None, None, 1.0)
        scale = self.residual_multiplier * drop.scale
        if cache is not None and drop.attn_rows is not None:
            rows = drop.attn_rows
            h = h.index_add(0, rows, self.attn(self.attn_norm(h), bias, cache, rows).to(h.dtype), alpha=scale)
        else:
            h = residual_update(h, lambda x: self.attn(self.attn_norm(x), bias, cache), drop.attn_rows, scale)
        return residual_update(h, lambda x: self.ffn(self.ffn_norm(x)), drop.ffn_rows, scale)


# leave(exit K, what its head reads [B, T, d], the positions still running [B, T] bool)
#   -> [B, T] bool: the running positions that stop at K
LeaveRule = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


class StepOutput(NamedTuple):
    """What ``Decoder.step`` computed: the stream after its last block [B, T, d] (a
    position that left early keeps its exit state), what each requested exit's head
    reads, the positions still running at the end ([B, T] bool; None: all of them) and
    the stream after every block that ran (``states=True``; else None)."""

    hidden: torch.Tensor
    reads: dict[int, torch.Tensor]
    running: torch.Tensor | None = None
    states: list[torch.Tensor] | None = None


class Decoder(nn.Module):
    """The Celerity decoder; other families subclass it (``framework.families.build_decoder``)."""

    family = "celerity"
    block_class = Block

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.family != self.family:
            raise ValueError(f"family={cfg.family!r} is invalid for {type(self).__name__}: "
                             "build the decoder with framework.families.build_decoder")
        self.config = cfg
        self.embed = self.new_embedding(cfg)
        self.blocks = nn.ModuleList(self.block_class(cfg, i) for i in range(cfg.n_layers))
        self.norm = self.block_class.new_norm(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.init_weights()

    @staticmethod
    def new_embedding(cfg: ModelConfig) -> nn.Embedding:
        """The token embedding (a family may scale its output, as Gemma's does)."""
        return nn.Embedding(cfg.vocab_size, cfg.d_model)

    @torch.no_grad()
    def init_weights(self, std: float | None = None) -> None:
        """Plain N(0, std²) init, norms at their identity (their own ``reset_parameters``);
        framework.training.parametrization re-initialises per Table A.2."""
        std = self.config.init_std if std is None else std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, type(self.norm)):
                module.reset_parameters()
        self.reset_buffers()

    def parameter_groups(self) -> dict[str, str]:
        """Parameter name -> its Table A.2 group, for every parameter (a tied head is the
        embedding): the blocks' own (``Block.parameter_groups``), the embedding, the final
        norm and the head."""
        groups = {f"embed.{name}": EMBEDDING for name, _ in self.embed.named_parameters()}
        for i, block in enumerate(self.blocks):
            groups.update({f"blocks.{i}.{name}": group for name, group in block.parameter_groups().items()})
        groups.update({f"norm.{name}": FINAL_NORM for name, _ in self.norm.named_parameters()})
        groups.update({f"head.{name}": UNEMBEDDING for name, _ in self.head.named_parameters()})
        return groups

    def reset_buffers(self) -> None:
        """Recompute the non-persistent buffers (ALiBi slopes): a decoder built on the
        meta device and moved with ``to_empty`` has none, and checkpoints do not hold them."""
        for module in self.modules():
            if isinstance(module, Attention):
                module.slopes = alibi_slopes(module.n_heads).to(module.qkv.weight.device)

    def forward(self, tokens: torch.Tensor, *, plan: DropPlan | None = None, exit_layer: int | None = None,
                skip_layers: Iterable[int] = (), cache: KVCache | None = None,
                padding: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, V]. ``plan`` only in training; ``exit_layer=k`` runs blocks
        0..k-1; ``skip_layers`` are passed through by the residual; ``cache`` decodes;
        ``padding`` [B, T] marks positions of left-padded rows that hold no token."""
        layers = self.active_layers(exit_layer, skip_layers)
        return self.logits(self.step(tokens, cache, layers=layers, plan=plan, padding=padding).hidden)

    def hidden(self, tokens: torch.Tensor, *, plan: DropPlan | None = None, exit_layer: int | None = None,
               skip_layers: Iterable[int] = (), padding: torch.Tensor | None = None,
               all_layers: bool = False) -> torch.Tensor | list[torch.Tensor]:
        """``step`` without a cache, as training reads it: the residual stream before the
        final norm; with ``all_layers`` the stream after every block that ran (the
        early-exit points), in order."""
        out = self.step(tokens, layers=self.active_layers(exit_layer, skip_layers), plan=plan, padding=padding,
                        states=all_layers)
        return out.states if all_layers else out.hidden

    def step(self, inputs: torch.Tensor, cache: KVCache | None = None, *, layers: Iterable[int] | None = None,
             padding: torch.Tensor | None = None, plan: DropPlan | None = None,
             exits: Mapping[int, nn.Module | None] | None = None, leave: LeaveRule | None = None,
             states: bool = False, rows: torch.Tensor | None = None, advance: bool = True) -> StepOutput:
        """The forward: every training step, measurement and decoding route is one call
        (mark padding -> attention bias -> embed -> blocks -> exit reads -> cache
        advance), whatever family the blocks belong to.

        ``inputs``: token ids [B, T], or a residual stream [B, T, d] to resume from
        (verification above a draft's exit, a skip set above the blocks it shares with
        the full model; ``layers=[]`` returns the embedding). ``cache``: decoding through
        a KV cache, whose length the step advances by T (None: the T positions alone).
        ``layers``: the blocks to run, in order (default: all). ``padding`` [B, T] marks
        positions holding no token. ``plan``: training's layer dropout (no cache).
        ``states``: keep the stream after every block (the early-exit points).

        ``exits`` {K: adapter or None}: after the blocks below K have run, the state exit
        K's head reads (through its adapter block, which writes its own K/V) goes to
        ``StepOutput.reads[K]``. ``leave(K, read, running)``, the one exit rule, may then
        return which running positions stop there: they keep their state, and later
        blocks update only the others (see ``_update``).

        ``rows`` (indices; one position a row, a decoding step): the rows the blocks compute;
        the others keep their state and give later tokens their K/V from it, as positions
        that left do under ``leave`` (the rule decided outside, between steps of a few blocks
        each). ``advance=False`` leaves the cache length alone, so that several such steps
        write the same position, the last one advancing it.
        """
        if rows is not None and (inputs.shape[1] != 1 or plan is not None or leave is not None):
            raise ValueError("rows is for a decoding step (one position a row), without a drop plan or an exit rule")
        if plan is not None:
            self.check_plan(plan, inputs.shape[0], cache)
            if leave is not None:
                raise ValueError("plan and leave are exclusive: a drop plan is training's, an exit rule decoding's")
        if cache is not None and padding is not None:
            cache.mark_padding(padding)
            padding = None
        h = self.embed(inputs) if inputs.dim() == 2 else inputs
        bias = self.attention_bias(h.shape[1], cache, padding)
        layers = list(range(len(self.blocks)) if layers is None else layers)
        collected: list[torch.Tensor] | None = [] if states else None
        reads: dict[int, torch.Tensor] = {}
        running: torch.Tensor | None = None  # [B, T] bool: the positions blocks still update (None: all)
        kept = None if rows is None else LayerDrop(rows, rows, 1.0)
        done = 0
        exits = exits or {}
        for exit_layer in sorted(exits):  # the keys alone: torch.compile sorts ints, not (int, module) pairs
            adapter = exits[exit_layer]
            below = [i for i in layers[done:] if i < exit_layer]
            h = self._run_blocks(below, h, bias, plan, cache, running, collected, kept)
            done += len(below)
            reads[exit_layer] = read = h if adapter is None else self._update(adapter, h, bias, kept, cache, running)
            if leave is not None and (running is None or bool(running.any())):
                still = torch.ones(h.shape[:2], dtype=torch.bool, device=h.device) if running is None else running
                leaving = leave(exit_layer, read, still) & still
                if bool(leaving.any()):
                    running = still & ~leaving
        h = self._run_blocks(layers[done:], h, bias, plan, cache, running, collected, kept)
        if cache is not None and advance:
            cache.advance(h.shape[1])
        return StepOutput(h, reads, running, collected)

    def _run_blocks(self, indices: list[int], h: torch.Tensor, bias: torch.Tensor | None, plan: DropPlan | None,
                    cache: KVCache | None, running: torch.Tensor | None,
                    collected: list[torch.Tensor] | None, kept: LayerDrop | None = None) -> torch.Tensor:
        """The blocks ``indices`` once each, in order (the one loop of ``step``); ``kept``: the
        rows every block computes (``step``'s ``rows``)."""
        for index in indices:
            h = self._update(self.blocks[index], h, bias, plan.layers[index] if plan else kept, cache, running)
            if collected is not None:
                collected.append(h)
        return h

    @staticmethod
    def _update(block: nn.Module, h: torch.Tensor, bias: torch.Tensor | None, drop: LayerDrop | None,
                cache: KVCache | None, running: torch.Tensor | None) -> torch.Tensor:
        """``block`` on the stream ``h`` [B, T, d], K/V written to ``cache`` at its length.
        Positions that are not ``running`` keep their state, and still give later tokens
        their K/V from it (CALM's state propagation): with one position a row (decoding)
        their rows are not computed at all (the saving early exit is for); with more, every
        position is, and the others keep their state."""
        if running is None:
            return block(h, bias, drop, cache)
        if h.shape[1] == 1:
            rows = running[:, 0].nonzero().flatten()
            return block(h, bias, LayerDrop(rows, rows, 1.0), cache)
        return torch.where(running[..., None], block(h, bias, drop, cache), h)

    def check_plan(self, plan: DropPlan, batch_size: int, cache: KVCache | None) -> None:
        if len(plan) != len(self.blocks):
            raise ValueError(f"plan has {len(plan)} layers; the model has {len(self.blocks)}")
        if plan.batch_size != batch_size:
            raise ValueError(f"plan.batch_size={plan.batch_size} is invalid: the tokens have {batch_size} rows")
        if cache is not None:  # a cache holds every row; dropped rows would leave stale K/V
            raise ValueError("plan and cache are exclusive: a drop plan is for training, a cache for decoding")

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and unembedding (with µP's 1/m_d forward multiplier)."""
        return self.head(self.norm(h)) * self.config.logit_multiplier

    def active_layers(self, exit_layer: int | None = None, skip_layers: Iterable[int] = ()) -> list[int]:
        n = len(self.blocks)
        if exit_layer is not None and not (_is_int(exit_layer) and 1 <= exit_layer <= n):
            raise ValueError(f"exit_layer={exit_layer!r} is invalid: must be an integer in 1..{n}")
        skip = set(skip_layers)
        outside = sorted((i for i in skip if not (_is_int(i) and 0 <= i < n)), key=str)
        if outside:
            raise ValueError(f"skip_layers={sorted(skip, key=str)} is invalid: layers must be in 0..{n - 1}")
        return [i for i in range(exit_layer or n) if i not in skip]

    def attention_bias(self, q_len: int, cache: KVCache | None = None,
                       padding: torch.Tensor | None = None) -> torch.Tensor | None:
        """The SDPA mask shared by all blocks, or None when FlexAttention computes it.
        Padding keys come from ``cache`` or, without one, from ``padding`` [B, q_len]."""
        device = self.embed.weight.device
        start, k_len = cache.span(q_len) if cache is not None else (None, q_len)
        key_padding = cache.key_padding(k_len) if cache is not None else padding
        if key_padding is None and self.use_flex(cache):
            return None
        return alibi_causal_bias(self.blocks[0].attn.slopes if len(self.blocks) else alibi_slopes(1),
                                 q_len, k_len, dtype=self.embed.weight.dtype, device=device,
                                 key_padding=key_padding, start=start)

    def use_flex(self, cache: KVCache | None) -> bool:
        if cache is not None and cache.static:  # its keys run past the queries: only a mask says where they end
            return False
        backend = self.config.attention
        if backend == "auto":
            return self.embed.weight.is_cuda and cache is None
        return backend == "flex"

    def new_cache(self, batch_size: int, max_len: int | None = None, *, extra_layers: int = 0,
                  static: bool = False) -> KVCache:
        """An empty cache; ``extra_layers`` slots after the model's for exit adapters;
        ``static``: fixed shapes, for CUDA graphs (framework/model/static_kv_cache.py)."""
        cfg = self.config
        return self.cache_class(static)(cfg.n_layers + extra_layers, batch_size, cfg.n_heads, cfg.head_dim,
                                        max_len or cfg.max_seq_len, dtype=self.embed.weight.dtype,
                                        device=self.embed.weight.device)

    @staticmethod
    def cache_class(static: bool) -> type[KVCache]:
        return StaticKVCache if static else KVCache

    def num_parameters(self, *, non_embedding: bool = False) -> int:
        total = sum(p.numel() for p in self.parameters())
        if non_embedding:
            total -= self.embed.weight.numel() + self.head.weight.numel()
        return total


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)  # numpy ints too
