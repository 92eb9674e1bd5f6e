"""Hugging Face's ``Qwen2ForCausalLM`` and the Qwen2 family: Llama's mapping, plus the
q/k/v biases (fused into ``attn.qkv.bias`` like the weights) and the sliding-window
fields, of which only "off" is accepted."""

from __future__ import annotations

from typing import Any

from framework.config import ModelConfig
from framework.families.llama.hf import LlamaMapping

# Read only to refuse sliding windows: with use_sliding_window false transformers
# ignores sliding_window and max_window_layers.
WINDOW_FIELDS = frozenset({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"})


class Qwen2Mapping(LlamaMapping):
    """Qwen2ForCausalLM <-> family qwen2."""

    family = "qwen2"
    model_type = "qwen2"
    architecture = "Qwen2ForCausalLM"
    function_fields = LlamaMapping.function_fields - {"attention_bias", "mlp_bias"} | WINDOW_FIELDS
    fixed_values: dict[str, Any] = {"hidden_act": "silu"}
    qkv_bias = True

    def check_family_fields(self, hf: dict[str, Any], source: str) -> None:
        if hf.get("use_sliding_window", False) is not False:
            raise self.refuse(source, "use_sliding_window", hf["use_sliding_window"],
                              "allowed: false (layerdrop's attention is full causal attention)")
        layer_types = hf.get("layer_types")
        if layer_types is not None:
            if not isinstance(layer_types, list):
                raise self.refuse(source, "layer_types", layer_types, "allowed: a list of 'full_attention'")
            odd = next((i for i, kind in enumerate(layer_types) if kind != "full_attention"), None)
            if odd is not None:
                raise self.refuse(source, f"layer_types[{odd}]", layer_types[odd], "allowed: 'full_attention'")

    def config_to_hf(self, cfg: ModelConfig, **ids: Any) -> dict[str, Any]:
        return {**super().config_to_hf(cfg, **ids), "use_sliding_window": False}

    def layer_names(self, i: int) -> dict[str, list[str]]:
        names = super().layer_names(i)
        if self.qkv_bias:
            names[f"blocks.{i}.attn.qkv.bias"] = [f"model.layers.{i}.self_attn.{p}_proj.bias" for p in "qkv"]
        return names


__all__ = ["Qwen2Mapping", "WINDOW_FIELDS"]
