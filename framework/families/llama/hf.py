"""Hugging Face's ``LlamaForCausalLM`` and the Llama family: configs and names both ways.

    config_from_hf(config.json dict) -> ModelConfig      refuses what would change the function
    config_to_hf(ModelConfig) -> config.json dict         loads as LlamaForCausalLM
    from_hf(read, cfg) -> (our name, tensor) ...          q/k/v and gate/up fused
    to_hf(state_dict, cfg) -> (HF name, tensor) ...       split again
    our_shapes(HF name -> shape, cfg) -> our name -> shape   for the check before anything is built

Our ``attn.qkv`` is [q; k; v] along its output rows and ``ffn.up`` is [gate; up]; the
rest is a rename. Every Hugging Face field that changes the function of the weights
must be understood here or the model is refused, naming the field: a model that
loads but computes something else would be worse than none.

``LlamaMapping`` is the base of the families built on Llama's blocks (qwen2, qwen3):
they change its class attributes and add their fields and tensors.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Iterable, Iterator

import torch

from framework.config import ModelConfig
from framework.families.family_spec import HFConfigError, shown

# Fields that change no function of the weights (ids, bookkeeping, training-only
# settings of Hugging Face's own trainer, and SmolLM2's ``is_llama_config`` marker).
# Any other field must be read below.
NEUTRAL_FIELDS = frozenset({
    "architectures", "model_type", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype",
    "transformers_version", "use_cache", "initializer_range", "pretraining_tp", "_name_or_path",
    "output_attentions", "output_hidden_states", "return_dict", "tie_encoder_decoder", "id2label", "label2id",
    "is_llama_config",
})
# Fields harmless at this value (SmolLM2 writes rope_interleaved: false, the halves
# layout framework/families/llama/rotary.py uses); any other value is refused.
HARMLESS_AT = {"rope_interleaved": False}
ROPE_KEYS = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
             "original_max_position_embeddings"}
INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class LlamaMapping:
    """LlamaForCausalLM <-> family llama."""

    family = "llama"
    model_type = "llama"
    architecture = "LlamaForCausalLM"
    # Fields read below; a family adds its own.
    function_fields = frozenset({
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
        "tie_word_embeddings", "attention_bias", "mlp_bias", "attention_dropout", "rope_theta", "rope_scaling",
        "rope_parameters", *HARMLESS_AT,
    })
    # field -> the one value this family represents (absent: that value)
    fixed_values: dict[str, Any] = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}

    # ------------------------------------------------------------ config.json -> ModelConfig

    def config_from_hf(self, hf: dict[str, Any], *, source: str = "config.json") -> ModelConfig:
        """The ModelConfig of a config.json (either transformers 4's ``rope_scaling`` or 5's
        ``rope_parameters``); HFConfigError naming the first field it cannot honour."""
        self.check_identity(hf, source)
        unknown = sorted(set(hf) - NEUTRAL_FIELDS - self.function_fields)
        if unknown:
            raise self.refuse(source, unknown[0], hf[unknown[0]],
                              "a field layerdrop does not know might change the model's function; the "
                              f"{self.architecture} fields it reads: " + ", ".join(sorted(self.function_fields)))
        for field, allowed in {**self.fixed_values, **HARMLESS_AT}.items():
            if hf.get(field, allowed) != allowed:
                raise self.refuse(source, field, hf[field], f"allowed: {allowed!r}")
        self.check_family_fields(hf, source)
        if hf.get("attention_dropout", 0.0) != 0.0:
            raise self.refuse(source, "attention_dropout", hf["attention_dropout"],
                              "allowed: 0.0 (layerdrop drops whole layers)")
        for field in INT_FIELDS:
            value = hf.get(field)
            if value is not None and (type(value) is not int or value <= 0):
                raise self.refuse(source, field, value, "allowed: a positive integer")
        try:
            return ModelConfig(**self.model_fields(hf, source))
        except KeyError as err:
            raise HFConfigError(f"{source}: the field {err.args[0]!r} is missing") from None
        except (TypeError, ValueError) as err:
            if isinstance(err, HFConfigError):
                raise
            raise HFConfigError(f"{source}: {shown(str(err))[1:-1]}") from None

    def check_identity(self, hf: dict[str, Any], source: str) -> None:
        """model_type and architectures are this family's."""
        if hf.get("model_type", self.model_type) != self.model_type:
            raise self.refuse(source, "model_type", hf.get("model_type"), f"allowed: {self.model_type!r}")
        architectures = hf.get("architectures") or [self.architecture]
        if architectures != [self.architecture]:
            raise self.refuse(source, "architectures", architectures, f"allowed: [{self.architecture!r}] "
                              f"(model_type {self.model_type!r})")

    def check_family_fields(self, hf: dict[str, Any], source: str) -> None:
        """The fields a family built on these blocks adds (none for Llama)."""

    def model_fields(self, hf: dict[str, Any], source: str) -> dict[str, Any]:
        """ModelConfig's fields from an already-checked config.json."""
        heads = hf["num_attention_heads"]
        return dict(family=self.family, vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
                    n_layers=hf["num_hidden_layers"], n_heads=heads, n_kv_heads=hf.get("num_key_value_heads") or heads,
                    head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, ffn_hidden=hf["intermediate_size"],
                    max_seq_len=hf.get("max_position_embeddings", 2048), norm_eps=hf.get("rms_norm_eps", 1e-6),
                    bias=False, tie_embeddings=bool(hf.get("tie_word_embeddings", False)), attention="sdpa",
                    **self.rope_fields(hf, source))

    def refuse(self, source: str, field: str, value: Any, allowed: str) -> HFConfigError:
        return HFConfigError(f"{source}: {field}={shown(value)} is not supported: {allowed}")

    def rope_fields(self, hf: dict[str, Any], source: str) -> dict[str, Any]:
        """RoPE's fields; ``rope_parameters`` (transformers 5) and ``rope_scaling`` (4) that
        say different things are refused (transformers would apply one of them)."""
        parameters, scaling = hf.get("rope_parameters"), hf.get("rope_scaling")
        for field, value in (("rope_parameters", parameters), ("rope_scaling", scaling)):
            if value is not None and not isinstance(value, dict):
                raise self.refuse(source, field, value, "allowed: an object (or null)")
        if parameters is not None and scaling is not None and _rope_meaning(parameters) != _rope_meaning(scaling):
            raise self.refuse(source, "rope_scaling", scaling, f"it conflicts with rope_parameters={shown(parameters)}: "
                              "give one of them")
        field = "rope_parameters" if parameters is not None else "rope_scaling"
        rope = dict((parameters if parameters is not None else scaling) or {})
        top_theta = hf.get("rope_theta")
        if top_theta is not None and "rope_theta" in rope and top_theta != rope["rope_theta"]:
            raise self.refuse(source, "rope_theta", top_theta, f"it conflicts with {field}.rope_theta="
                              f"{shown(rope['rope_theta'])}")
        theta = rope.get("rope_theta", top_theta if top_theta is not None else 10_000.0)
        kind = rope.get("rope_type", rope.get("type", "default"))
        extra = sorted(set(rope) - ROPE_KEYS)
        if extra:
            raise self.refuse(source, f"{field}.{extra[0]}", rope[extra[0]], "allowed keys: " + ", ".join(sorted(ROPE_KEYS)))
        if kind == "default":
            return {"rope_theta": float(theta)}
        if kind != "llama3":
            raise self.refuse(source, f"{field}.rope_type", kind, "allowed: 'default', 'llama3'")
        return {"rope_theta": float(theta), "rope_type": "llama3", "rope_factor": float(rope["factor"]),
                "rope_low_freq_factor": float(rope["low_freq_factor"]),
                "rope_high_freq_factor": float(rope["high_freq_factor"]),
                "rope_original_max_seq_len": int(rope["original_max_position_embeddings"])}

    # ------------------------------------------------------------ ModelConfig -> config.json

    def config_to_hf(self, cfg: ModelConfig, *, bos_id: int | None = None,
                     eos_id: int | list[int] | None = None) -> dict[str, Any]:
        """config.json for the transformers class (transformers 4's rope fields, which 5 reads too)."""
        if cfg.logit_multiplier != 1.0 or cfg.residual_multiplier != 1.0:
            raise HFConfigError(f"logit_multiplier={cfg.logit_multiplier!r}, residual_multiplier="
                                f"{cfg.residual_multiplier!r}: {self.architecture} has no forward multipliers "
                                "(train with m_d = m_L = 1 to export to Hugging Face)")
        scaling = None
        if cfg.rope_type == "llama3":
            scaling = {"rope_type": "llama3", "factor": cfg.rope_factor, "low_freq_factor": cfg.rope_low_freq_factor,
                       "high_freq_factor": cfg.rope_high_freq_factor,
                       "original_max_position_embeddings": cfg.rope_original_max_seq_len}
        return {
            "architectures": [self.architecture], "model_type": self.model_type, "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_dim, "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
            "hidden_act": "silu", "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
            "tie_word_embeddings": cfg.tie_embeddings, **self.fixed_values, "attention_dropout": 0.0,
            "rope_theta": cfg.rope_theta, "rope_scaling": scaling,
            "bos_token_id": bos_id, "eos_token_id": eos_id, "torch_dtype": "float32",
        }

    # ------------------------------------------------------------ tensor names

    def layer_names(self, i: int) -> dict[str, list[str]]:
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

    def name_map(self, cfg: ModelConfig) -> dict[str, list[str]]:
        """Every tensor of the decoder -> its Hugging Face parts."""
        names = {"embed.weight": ["model.embed_tokens.weight"]}
        for i in range(cfg.n_layers):
            names.update(self.layer_names(i))
        names["norm.weight"] = ["model.norm.weight"]
        # A tied head is the embedding (Hugging Face then writes no lm_head.weight).
        names["head.weight"] = ["model.embed_tokens.weight"] if cfg.tie_embeddings else ["lm_head.weight"]
        return names

    def hf_names(self, cfg: ModelConfig) -> set[str]:
        return {part for parts in self.name_map(cfg).values() for part in parts}

    def from_hf(self, read: Callable[[str], torch.Tensor], cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
        """Our (name, tensor) pairs, reading each Hugging Face tensor through ``read``
        (one fused tensor at a time)."""
        for name, parts in self.name_map(cfg).items():
            tensors = [read(part) for part in parts]
            yield name, tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)

    def our_shapes(self, hf_shapes: dict[str, tuple[int, ...]], cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """Our name -> the shape its Hugging Face parts make (rows added up), for the layers
        the file holds (not the config's count, which may be absurd). A name whose parts
        are not all there is left out (missing); a Hugging Face name that is no part of
        any is kept as it is (unexpected); parts whose other dimensions differ give the
        first odd part's shape, which then matches nothing."""
        layers = sorted({int(match[1]) for name in hf_shapes if (match := _HF_LAYER.match(name))})
        names = {name: parts for name, parts in self.name_map(dataclasses.replace(cfg, n_layers=1)).items()
                 if not name.startswith("blocks.")}
        for i in layers:
            names.update(self.layer_names(i))
        shapes: dict[str, tuple[int, ...]] = {}
        for name, parts in names.items():
            if not all(part in hf_shapes for part in parts):
                continue
            found = [tuple(hf_shapes[part]) for part in parts]
            odd = next((shape for shape in found if not shape or shape[1:] != found[0][1:]), None)
            shapes[name] = odd if odd is not None else (sum(s[0] for s in found), *found[0][1:])
        known = {part for parts in names.values() for part in parts}
        shapes.update({name: tuple(shape) for name, shape in hf_shapes.items() if name not in known})
        return shapes

    def to_hf(self, state: dict[str, torch.Tensor], cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
        """Hugging Face (name, tensor) pairs of a decoder's state dict, fused tensors split."""
        for name, parts in self.name_map(cfg).items():
            if name == "head.weight" and cfg.tie_embeddings:
                continue
            for part, piece in zip(parts, self.split(name, state[name], cfg)):
                yield part, piece

    def split(self, name: str, tensor: torch.Tensor, cfg: ModelConfig) -> Iterable[torch.Tensor]:
        if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            kv = cfg.n_kv_heads * cfg.head_dim
            return tensor.split([cfg.attn_dim, kv, kv], dim=0)
        if name.endswith("ffn.up.weight"):
            return tensor.chunk(2, dim=0)
        return [tensor]


def _rope_meaning(rope: dict[str, Any]) -> tuple:
    """What a rope dict says, spelled either way (``type`` or ``rope_type``; theta aside,
    since transformers 4's rope_scaling never holds it)."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    return (kind, *sorted((k, v) for k, v in rope.items() if k not in ("rope_type", "type", "rope_theta")))


__all__ = ["LlamaMapping", "NEUTRAL_FIELDS", "HARMLESS_AT", "ROPE_KEYS"]
