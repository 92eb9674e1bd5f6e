"""Hugging Face's ``LlamaForCausalLM`` and the Llama family: configs and names both ways.

    from_hf_config(config.json dict) -> ModelConfig      refuses what would change the function
    to_hf_config(ModelConfig) -> config.json dict         loads as LlamaForCausalLM
    from_hf(lookup, cfg) -> (our name, tensor) ...        q/k/v and gate/up fused
    to_hf(state_dict, cfg) -> (HF name, tensor) ...       split again

Our ``attn.qkv`` is [q; k; v] along its output rows and ``ffn.up`` is [gate; up]; the
rest is a rename. Every Hugging Face field that changes the function of the weights
must be understood here or the model is refused, naming the field: a model that
loads but computes something else would be worse than none.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import torch

from framework.config import ModelConfig

ARCHITECTURE = "LlamaForCausalLM"
MODEL_TYPE = "llama"
# Fields that change no function of the weights (ids, bookkeeping, training-only
# settings of Hugging Face's own trainer). Any other field must be read below.
NEUTRAL_FIELDS = {
    "architectures", "model_type", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype",
    "transformers_version", "use_cache", "initializer_range", "pretraining_tp", "_name_or_path",
    "output_attentions", "output_hidden_states", "return_dict", "tie_encoder_decoder", "id2label", "label2id",
}
FUNCTION_FIELDS = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
    "tie_word_embeddings", "attention_bias", "mlp_bias", "attention_dropout", "rope_theta", "rope_scaling",
    "rope_parameters",
}
ROPE_KEYS = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
             "original_max_position_embeddings"}


class HFConfigError(ValueError):
    """A Hugging Face config this family cannot represent exactly; the message names the field."""


def from_hf_config(hf: dict[str, Any], *, source: str = "config.json") -> ModelConfig:
    """The ModelConfig of a Llama config.json (either transformers 4's ``rope_scaling``
    or 5's ``rope_parameters``); HFConfigError naming the first field it cannot honour."""

    def refuse(field: str, value: Any, allowed: str) -> HFConfigError:
        return HFConfigError(f"{source}: {field}={value!r} is not supported: {allowed}")

    architectures = hf.get("architectures") or [ARCHITECTURE]
    if hf.get("model_type", MODEL_TYPE) != MODEL_TYPE or list(architectures) != [ARCHITECTURE]:
        field = "model_type" if hf.get("model_type", MODEL_TYPE) != MODEL_TYPE else "architectures"
        raise refuse(field, hf.get(field), f"allowed: {MODEL_TYPE!r} / [{ARCHITECTURE!r}] (the Llama family)")
    unknown = sorted(set(hf) - NEUTRAL_FIELDS - FUNCTION_FIELDS)
    if unknown:
        raise refuse(unknown[0], hf[unknown[0]], "a field layerdrop does not know might change the model's "
                                                 "function; the Llama fields it reads: "
                                                 + ", ".join(sorted(FUNCTION_FIELDS)))
    for field, allowed in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if hf.get(field, allowed) != allowed:
            raise refuse(field, hf[field], f"allowed: {allowed!r}")
    if hf.get("attention_dropout", 0.0) != 0.0:
        raise refuse("attention_dropout", hf["attention_dropout"], "allowed: 0.0 (layerdrop drops whole layers)")
    try:
        heads = hf["num_attention_heads"]
        rope = _rope_fields(hf, refuse)
        return ModelConfig(
            family="llama", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
            n_heads=heads, n_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, ffn_hidden=hf["intermediate_size"],
            max_seq_len=hf.get("max_position_embeddings", 2048), norm_eps=hf.get("rms_norm_eps", 1e-6), bias=False,
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)), attention="sdpa", **rope)
    except KeyError as err:
        raise HFConfigError(f"{source}: the field {err.args[0]!r} is missing") from None
    except (TypeError, ValueError) as err:
        if isinstance(err, HFConfigError):
            raise
        raise HFConfigError(f"{source}: {err}") from None


def _rope_fields(hf: dict[str, Any], refuse: Callable[..., HFConfigError]) -> dict[str, Any]:
    scaling = hf.get("rope_parameters") if hf.get("rope_parameters") is not None else hf.get("rope_scaling")
    field = "rope_parameters" if hf.get("rope_parameters") is not None else "rope_scaling"
    scaling = dict(scaling or {})
    theta = scaling.get("rope_theta", hf.get("rope_theta", 10_000.0))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    extra = sorted(set(scaling) - ROPE_KEYS)
    if extra:
        raise refuse(f"{field}.{extra[0]}", scaling[extra[0]], "allowed keys: " + ", ".join(sorted(ROPE_KEYS)))
    if kind == "default":
        return {"rope_theta": float(theta)}
    if kind != "llama3":
        raise refuse(f"{field}.rope_type", kind, "allowed: 'default', 'llama3'")
    return {"rope_theta": float(theta), "rope_type": "llama3", "rope_factor": float(scaling["factor"]),
            "rope_low_freq_factor": float(scaling["low_freq_factor"]),
            "rope_high_freq_factor": float(scaling["high_freq_factor"]),
            "rope_original_max_seq_len": int(scaling["original_max_position_embeddings"])}


def to_hf_config(cfg: ModelConfig, *, bos_id: int | None = None, eos_id: int | None = None) -> dict[str, Any]:
    """config.json for ``LlamaForCausalLM`` (transformers 4's rope fields, which 5 reads too)."""
    if cfg.family != "llama":
        raise HFConfigError(f"family={cfg.family!r} has no transformers class: a Celerity decoder (ALiBi "
                            "attention, squared-ReLU FFN) cannot be written as LlamaForCausalLM; "
                            "--format hf needs family='llama'")
    if cfg.logit_multiplier != 1.0 or cfg.residual_multiplier != 1.0:
        raise HFConfigError(f"logit_multiplier={cfg.logit_multiplier!r}, residual_multiplier="
                            f"{cfg.residual_multiplier!r}: LlamaForCausalLM has no forward multipliers "
                            "(train with m_d = m_L = 1 to export to Hugging Face)")
    scaling = None
    if cfg.rope_type == "llama3":
        scaling = {"rope_type": "llama3", "factor": cfg.rope_factor, "low_freq_factor": cfg.rope_low_freq_factor,
                   "high_freq_factor": cfg.rope_high_freq_factor,
                   "original_max_position_embeddings": cfg.rope_original_max_seq_len}
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_dim, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "hidden_act": "silu", "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0, "rope_theta": cfg.rope_theta, "rope_scaling": scaling,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "torch_dtype": "float32",
    }


# ------------------------------------------------------------------ tensor names


def _layer_names(i: int) -> dict[str, list[str]]:
    """Our names of layer i -> the Hugging Face names concatenated (along rows) into it."""
    hf = f"model.layers.{i}"
    return {
        f"blocks.{i}.attn_norm.weight": [f"{hf}.input_layernorm.weight"],
        f"blocks.{i}.attn.qkv.weight": [f"{hf}.self_attn.{p}_proj.weight" for p in "qkv"],
        f"blocks.{i}.attn.proj.weight": [f"{hf}.self_attn.o_proj.weight"],
        f"blocks.{i}.ffn_norm.weight": [f"{hf}.post_attention_layernorm.weight"],
        f"blocks.{i}.ffn.up.weight": [f"{hf}.mlp.gate_proj.weight", f"{hf}.mlp.up_proj.weight"],
        f"blocks.{i}.ffn.down.weight": [f"{hf}.mlp.down_proj.weight"],
    }


def name_map(cfg: ModelConfig) -> dict[str, list[str]]:
    """Every tensor of the decoder -> its Hugging Face parts (the tied head: none)."""
    names = {"embed.weight": ["model.embed_tokens.weight"]}
    for i in range(cfg.n_layers):
        names.update(_layer_names(i))
    names["norm.weight"] = ["model.norm.weight"]
    # A tied head is the embedding (Hugging Face then writes no lm_head.weight).
    names["head.weight"] = ["model.embed_tokens.weight"] if cfg.tie_embeddings else ["lm_head.weight"]
    return names


def hf_names(cfg: ModelConfig) -> set[str]:
    return {part for parts in name_map(cfg).values() for part in parts}


def from_hf(read: Callable[[str], torch.Tensor], cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Our (name, tensor) pairs, reading each Hugging Face tensor through ``read``
    (one fused tensor at a time)."""
    for name, parts in name_map(cfg).items():
        tensors = [read(part) for part in parts]
        yield name, tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Hugging Face (name, tensor) pairs of a decoder's state dict, fused tensors split."""
    for name, parts in name_map(cfg).items():
        if name == "head.weight" and cfg.tie_embeddings:
            continue
        tensor = state[name]
        for part, piece in zip(parts, _split(name, tensor, cfg)):
            yield part, piece


def _split(name: str, tensor: torch.Tensor, cfg: ModelConfig) -> Iterable[torch.Tensor]:
    if name.endswith("attn.qkv.weight"):
        kv = cfg.n_kv_heads * cfg.head_dim
        return tensor.split([cfg.attn_dim, kv, kv], dim=0)
    if name.endswith("ffn.up.weight"):
        return tensor.chunk(2, dim=0)
    return [tensor]


__all__ = ["from_hf_config", "to_hf_config", "from_hf", "to_hf", "name_map", "hf_names", "HFConfigError",
           "ARCHITECTURE", "NEUTRAL_FIELDS", "FUNCTION_FIELDS"]
