"""Hugging Face's ``GemmaForCausalLM`` and the Gemma family: Llama's mapping (the tensor
names are Llama's) with Gemma's activation, its explicit ``head_dim`` (transformers' 256
when it is absent is not guessed) and a head tied to the embedding unless the config says
otherwise."""

from __future__ import annotations

from typing import Any

from framework.config import ModelConfig
from framework.families.llama.hf import LlamaMapping

# "gelu" is what the first Gemma releases wrote; transformers runs it as the tanh GELU.
ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")


class GemmaMapping(LlamaMapping):
    """GemmaForCausalLM <-> family gemma."""

    family = "gemma"
    model_type = "gemma"
    architecture = "GemmaForCausalLM"
    function_fields = LlamaMapping.function_fields - {"mlp_bias"} | {"hidden_activation", "use_bidirectional_attention"}
    fixed_values: dict[str, Any] = {"attention_bias": False}

    def check_family_fields(self, hf: dict[str, Any], source: str) -> None:
        for field in ("hidden_act", "hidden_activation"):
            if hf.get(field) is not None and hf[field] not in ACTIVATIONS:
                raise self.refuse(source, field, hf[field], "allowed: " + ", ".join(map(repr, ACTIVATIONS)))
        if hf.get("use_bidirectional_attention"):
            raise self.refuse(source, "use_bidirectional_attention", hf["use_bidirectional_attention"],
                              "allowed: false (layerdrop's attention is causal)")

    def model_fields(self, hf: dict[str, Any], source: str) -> dict[str, Any]:
        hf["head_dim"]  # required: a KeyError names it
        return {**super().model_fields(hf, source), "tie_embeddings": bool(hf.get("tie_word_embeddings", True))}

    def config_to_hf(self, cfg: ModelConfig, **ids: Any) -> dict[str, Any]:
        return {**super().config_to_hf(cfg, **ids), "hidden_act": ACTIVATIONS[0]}


__all__ = ["GemmaMapping", "ACTIVATIONS"]
