"""What a model family tells the rest of the project: ``FamilySpec``.

Each family's ``spec.py`` holds one (``FAMILY``); framework/families/registry.py finds it
by the family's folder name. The FLOP and memory formulas are the block class's
(``ffn_matrices``, ``activation_bytes_per_token``), so they live beside the blocks they
count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import torch

    from framework.config import ModelConfig
    from framework.model.decoder import Decoder


SHOWN_CHARACTERS = 60  # an error line quotes at most this much of a value (a field may hold megabytes)


class HFConfigError(ValueError):
    """A Hugging Face config a family cannot represent exactly; the message names the field."""


def shown(value: Any) -> str:
    """repr(value), cut to SHOWN_CHARACTERS."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARACTERS else f"{text[:SHOWN_CHARACTERS]}... ({len(text)} characters)"


class HFMapping(Protocol):
    """A family's Hugging Face mapping (framework/families/llama/hf.py is the model)."""

    model_type: str  # config.json's model_type this mapping reads
    architecture: str  # the transformers class it writes

    def config_from_hf(self, hf: dict[str, Any], *, source: str) -> ModelConfig: ...

    def config_to_hf(self, cfg: ModelConfig, *, bos_id: int | None, eos_id: int | list[int] | None) -> dict[str, Any]: ...

    def hf_names(self, cfg: ModelConfig) -> set[str]: ...

    def from_hf(self, read: Callable[[str], torch.Tensor], cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]: ...

    def to_hf(self, state: dict[str, torch.Tensor], cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]: ...

    def our_shapes(self, hf_shapes: dict[str, tuple[int, ...]], cfg: ModelConfig) -> dict[str, tuple[int, ...]]: ...


@dataclass(frozen=True)
class FamilySpec:
    """One model family: its decoder class and its Hugging Face mapping (None: it has no
    transformers class, and ``export --format hf`` refuses it)."""

    name: str
    decoder: type[Decoder]
    hf: HFMapping | None = None
    # Its blocks' shapes depend on n_heads only through n_heads·head_dim: a shape check
    # may build its one-block stand-in with one head (cheap whatever the config asks).
    shapes_need_heads: bool = True

    @property
    def block(self) -> type:
        return self.decoder.block_class

    @property
    def ffn_matrices(self) -> int:
        """d×f matrices in one block's FFN (2 for a plain FFN, 3 for a gated one)."""
        return self.block.ffn_matrices

    def activation_bytes_per_token(self, cfg: ModelConfig, mixed: bool) -> int:
        """Bytes one block saves for backward per token (framework/recipes/device_memory.py)."""
        return self.block.activation_bytes_per_token(cfg, mixed)

    def standin_config(self, cfg: ModelConfig) -> ModelConfig:
        """A one-block config with ``cfg``'s tensor shapes, for checking names and shapes on
        the meta device (framework/checkpoint/loader.py)."""
        heads = {} if self.shapes_need_heads else dict(n_heads=1, n_kv_heads=1, head_dim=cfg.attn_dim)
        return dataclasses.replace(cfg, n_layers=1, **heads)


__all__ = ["FamilySpec", "HFMapping", "HFConfigError", "shown"]
