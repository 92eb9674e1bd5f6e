"""Balcony-style exit adapters on a frozen backbone: the adapter blocks and their files.

Balcony (Jamialahmadi et al., 2025; paper §8.2.1) keeps the pretrained model as it is
and adds, at each chosen exit layer k, ONE extra transformer block of the backbone's
own architecture. An exit's prediction is

    logits_k = head(norm(adapter_k(h_k)))        h_k = residual stream after blocks 0..k-1

with the backbone's final norm and unembedding, shared by every exit and frozen. Only
the adapters' weights are saved (``adapters.safetensors`` plus ``adapters.json`` naming
the backbone and the exits). Training is eval/adapters/fit.py (`layerdrop adapters
fit`), the per-exit comparison eval/adapters/evaluation.py (`layerdrop adapters eval`);
decoding reads adapters through ``load_adapters`` here, which needs no Lightning.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from eval import options
from framework.checkpoint import CheckpointError, load_decoder
from framework.config import ModelConfig
from framework.families.registry import new_block
from framework.files.atomic_write import replacing, write_json
from framework.files.nesting import NestingError, json_document
from framework.model.decoder import Decoder

WEIGHTS_FILE = "adapters.safetensors"
META_FILE = "adapters.json"
INITS = ("last", "random")


def check_exits(exits: Sequence[int], num_layers: int) -> list[int]:
    """Sorted, distinct exits in 1..L-1 (an exit at L would distil the model into itself)."""
    bad = [e for e in exits if isinstance(e, bool) or not isinstance(e, int) or not 1 <= e <= num_layers - 1]
    if bad or not exits:
        raise ValueError(f"exits={list(exits)} is invalid: give at least one exit layer, each in "
                         f"1..{num_layers - 1} (the backbone has {num_layers} layers)")
    return sorted(set(exits))


def default_exits(num_layers: int) -> list[int]:
    """A quarter, half and three quarters of the depth (as in the paper's Fig. 7)."""
    return sorted({min(num_layers - 1, max(1, round(num_layers * f))) for f in (0.25, 0.5, 0.75)})


class ExitAdapters(nn.Module):
    """One extra ``Block`` per exit layer; the norm and head are the backbone's."""

    def __init__(self, cfg: ModelConfig, exits: Sequence[int]) -> None:
        super().__init__()
        self.exits = check_exits(list(exits), cfg.n_layers)
        # Adapter i is layer n_layers + i of a KV cache made with extra_layers=len(exits).
        self.blocks = nn.ModuleDict({str(e): new_block(cfg, cfg.n_layers + i) for i, e in enumerate(self.exits)})
        self.init_std = cfg.init_std

    @torch.no_grad()
    def initialise(self, backbone: Decoder, how: str = "last") -> None:
        """Copy the backbone's last block into every adapter, or draw fresh weights."""
        if how not in INITS:
            raise ValueError(f"init={how!r} is invalid: allowed: {', '.join(INITS)}")
        for block in self.blocks.values():
            if how == "last":
                block.load_state_dict(backbone.blocks[-1].state_dict())
                continue
            for module in block.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, std=self.init_std)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
                elif isinstance(module, nn.LayerNorm):
                    nn.init.ones_(module.weight)
                    nn.init.zeros_(module.bias)

    def as_exits(self) -> dict[int, nn.Module]:
        """{exit k: its adapter block}, as ``Decoder.step(exits=...)`` runs them: adapter k
        on the stream after block k-1, read in ``StepOutput.reads[k]``."""
        return {e: self.blocks[str(e)] for e in self.exits}


# ------------------------------------------------------------------------ files


def save_adapters(adapters: ExitAdapters, out_dir: str | Path, meta: dict, *, overwrite: bool = False) -> Path:
    out_dir = Path(out_dir)
    if (out_dir / WEIGHTS_FILE).exists() and not overwrite:
        raise FileExistsError(options.exists_message(out_dir / WEIGHTS_FILE))
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in adapters.state_dict().items()}
    with replacing(out_dir / WEIGHTS_FILE) as partial:
        save_file(state, str(partial))
    write_json(out_dir / META_FILE, {"exits": adapters.exits, **meta})
    return out_dir


def read_meta(path: str | Path) -> dict:
    path = Path(path)
    for name in (WEIGHTS_FILE, META_FILE):
        if not (path / name).is_file():
            raise CheckpointError(f"adapters folder {str(path)!r} has no {name} (made by `layerdrop adapters fit`)")
    where = f"adapters folder {str(path)!r}: {META_FILE}"
    try:
        meta = json_document((path / META_FILE).read_text(encoding="utf-8"), where)
    except (ValueError, UnicodeDecodeError) as err:  # not JSON, not UTF-8, or nested too deep
        raise CheckpointError(str(err) if isinstance(err, NestingError) else f"{where} is not valid JSON") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("exits"), list):
        raise CheckpointError(f"{where} is invalid: expected an object with a list of \"exits\" (as "
                              "`layerdrop adapters fit` writes)")
    return meta


def load_adapters(path: str | Path, backbone: Decoder) -> tuple[ExitAdapters, dict]:
    """Adapters saved by ``save_adapters``, checked against the backbone's shape."""
    meta = read_meta(path)
    if meta.get("model") != backbone.config.to_dict():
        raise CheckpointError(f"adapters {str(path)!r} were trained for another model shape: "
                              f"{meta.get('model')} vs the backbone's {backbone.config.to_dict()}")
    adapters = ExitAdapters(backbone.config, meta["exits"]).to(backbone.embed.weight.device)
    adapters.load_state_dict(load_file(str(Path(path) / WEIGHTS_FILE)))
    return adapters.eval(), meta


# ------------------------------------------------------------------------ flags


def layer_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(";", ",").split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of layer numbers") from None


def load_backbone(parser: argparse.ArgumentParser, path: str, device: str = "cpu") -> Decoder:
    try:
        backbone, _ = load_decoder(path, map_location=device)
    except (CheckpointError, FileNotFoundError) as err:
        parser.error(str(err))
    return backbone
