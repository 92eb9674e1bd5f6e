"""Hugging Face's ``Qwen3ForCausalLM`` and the Qwen3 family: Qwen2's mapping without the
q/k/v biases (``attention_bias`` must be false), with the per-head q/k norms and an
explicit ``head_dim`` (transformers' default of 128 when it is absent is not guessed)."""

from __future__ import annotations

from typing import Any

from framework.families.qwen2.hf import Qwen2Mapping


class Qwen3Mapping(Qwen2Mapping):
    """Qwen3ForCausalLM <-> family qwen3."""

    family = "qwen3"
    model_type = "qwen3"
    architecture = "Qwen3ForCausalLM"
    function_fields = Qwen2Mapping.function_fields | {"attention_bias"}
    fixed_values: dict[str, Any] = {"hidden_act": "silu", "attention_bias": False}
    qkv_bias = False

    def model_fields(self, hf: dict[str, Any], source: str) -> dict[str, Any]:
        hf["head_dim"]  # required: a KeyError names it
        return super().model_fields(hf, source)

    def layer_names(self, i: int) -> dict[str, list[str]]:
        names = super().layer_names(i)
        for part in ("q_norm", "k_norm"):
            names[f"blocks.{i}.attn.{part}.weight"] = [f"model.layers.{i}.self_attn.{part}.weight"]
        return names


__all__ = ["Qwen3Mapping"]
