"""The on-disk forms of a trained decoder, and the one loader every eval command uses.

Two forms:
- a Lightning ``.ckpt`` written by ``layerdrop pretrain``: the module's weights under
  ``state_dict`` with the prefix ``model.``, and the ModelConfig as a plain dict under
  ``checkpoint["layerdrop"]["model_config"]``;
- an exported folder: ``model.safetensors`` + ``config.json`` (``{"model": {...}}``),
  written by ``layerdrop export``.

Loading reads tensors and plain containers only (``weights_only=True`` / safetensors):
a checkpoint handed over by someone else must never be able to run code.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from framework.config import ModelConfig
from framework.model import Decoder

CKPT_KEY = "layerdrop"
MODEL_PREFIX = "model."
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


class CheckpointError(ValueError):
    """A checkpoint path or content that cannot be loaded; the message says why."""


def load_decoder(path: str | Path, *, map_location: str | torch.device = "cpu") -> tuple[Decoder, ModelConfig]:
    """Load a Decoder (eval mode) and its config from a ``.ckpt`` or an exported folder."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir():
        model_cfg, state = _read_exported(path)
    else:
        model_cfg, state = _read_lightning(path)
    with torch.device("meta"):
        decoder = Decoder(model_cfg)
    decoder = decoder.to_empty(device=map_location)
    decoder.init_weights()  # restores non-persistent buffers (ALiBi slopes)
    try:
        missing, unexpected = decoder.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shapes that disagree with the config
        raise CheckpointError(f"checkpoint {str(path)!r} does not match its config: "
                              f"{str(err).splitlines()[-1].strip()}") from None
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {str(path)!r} does not match its config: "
                              f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    return decoder.eval(), model_cfg


def read_model_config(path: str | Path) -> ModelConfig:
    """Only the config of a checkpoint (no weights materialised for exported folders)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir():
        return _config_from(_read_json(path / CONFIG_FILE), path)
    return _read_lightning(path)[0]


def _read_lightning(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # an unpickling refusal or a corrupt file
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be loaded safely: {reason}") from None
    if not isinstance(ckpt, dict) or CKPT_KEY not in ckpt or "state_dict" not in ckpt:
        raise CheckpointError(f"checkpoint {str(path)!r} is not a layerdrop checkpoint "
                              f"(no {CKPT_KEY!r} / 'state_dict' entries)")
    meta = ckpt[CKPT_KEY]
    if not isinstance(meta, dict) or "model_config" not in meta:
        raise CheckpointError(f"checkpoint {str(path)!r} has no {CKPT_KEY}.model_config entry")
    model_cfg = _config_from({"model": meta["model_config"]}, path)
    state = {k[len(MODEL_PREFIX):]: v for k, v in ckpt["state_dict"].items() if k.startswith(MODEL_PREFIX)}
    return model_cfg, state


def _read_exported(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        if not (path / name).is_file():
            raise CheckpointError(f"exported model folder {str(path)!r} has no {name}")
    model_cfg = _config_from(_read_json(path / CONFIG_FILE), path)
    try:
        return model_cfg, load_file(str(path / WEIGHTS_FILE))
    except Exception as err:  # safetensors raises its own error type on a corrupt file
        raise CheckpointError(f"{str(path / WEIGHTS_FILE)!r} cannot be read: {err}") from None


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{str(path)!r} does not exist")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{str(path)!r} is not valid JSON: {err}") from None


def _config_from(data: dict, path: Path) -> ModelConfig:
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise CheckpointError(f"{str(path)!r}: config has no 'model' section")
    try:
        return ModelConfig.from_dict(data["model"])
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{str(path)!r}: {err}") from None


def export_decoder(decoder: Decoder, out_dir: str | Path, *, extra: dict | None = None,
                   overwrite: bool = False) -> Path:
    """Write ``model.safetensors`` + ``config.json``; refuses to replace an export."""
    out_dir = Path(out_dir)
    if (out_dir / WEIGHTS_FILE).exists() and not overwrite:
        raise CheckpointError(f"{str(out_dir)!r} already holds {WEIGHTS_FILE}; pass --overwrite to replace it")
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in decoder.state_dict().items()}
    save_file(state, str(out_dir / WEIGHTS_FILE))
    config = {"model": decoder.config.to_dict(), **(extra or {})}
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


# ------------------------------------------------------------------ layerdrop export

TOKENIZER_FILE = "tokenizer.json"


def export_main(argv: list[str]) -> int:
    """`layerdrop export --ckpt X --out DIR [--overwrite]`: a training checkpoint (or an
    export) -> model.safetensors + config.json, with the data's tokenizer beside them."""
    import argparse
    import shutil

    parser = argparse.ArgumentParser(
        prog="layerdrop export",
        description="Write a checkpoint's decoder as model.safetensors + config.json (+ tokenizer.json).",
        epilog="Example: layerdrop export --ckpt runs/tiny/checkpoints/last.ckpt --out exports/tiny")
    parser.add_argument("--ckpt", required=True, help="a .ckpt written by layerdrop pretrain, or an exported folder")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an export already in --out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        if (out / WEIGHTS_FILE).exists() and not args.overwrite:  # before loading anything
            raise CheckpointError(f"{str(out)!r} already holds {WEIGHTS_FILE}; pass --overwrite to replace it")
        decoder, _ = load_decoder(args.ckpt)
        extra = _training_record(Path(args.ckpt))
        tokenizer = extra.pop("_tokenizer_path", None)
        export_decoder(decoder, out, extra=extra, overwrite=args.overwrite)
        if tokenizer is not None:
            shutil.copyfile(tokenizer, out / TOKENIZER_FILE)
    except CheckpointError as err:
        parser.error(str(err))  # "error: ..." on stderr, exit status 2
    print(f"exported {args.ckpt} -> {out}/{WEIGHTS_FILE} + {CONFIG_FILE}"
          + (f" + {TOKENIZER_FILE}" if tokenizer is not None else ""))
    return 0


def _training_record(path: Path) -> dict:
    """What config.json keeps of the training run: the step, the layer-dropout and
    parametrization settings, the tokenizer (copied when the prepared data is at hand)."""
    if path.is_dir():
        data = _read_json(path / CONFIG_FILE)
        record = {k: v for k, v in data.items() if k != "model"}
        if (path / TOKENIZER_FILE).is_file():
            record["_tokenizer_path"] = path / TOKENIZER_FILE
        return record
    ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    entry = ckpt.get(CKPT_KEY, {})
    record = {"training": {"global_step": ckpt.get("global_step"),
                           **{k: entry[k] for k in ("layer_dropout", "parametrization") if k in entry}}}
    data_dir = (ckpt.get("datamodule_hyper_parameters") or {}).get("data_dir")
    if isinstance(data_dir, str) and (Path(data_dir) / TOKENIZER_FILE).is_file():
        record["tokenizer"] = TOKENIZER_FILE
        record["_tokenizer_path"] = Path(data_dir) / TOKENIZER_FILE
    return record
