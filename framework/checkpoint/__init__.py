"""Checkpoints: the on-disk forms of a trained decoder, and everything that writes,
finds, resumes, proves harmless and exports them.

    base.py             names, the one error (CheckpointError), Pieces, the Form protocol
    forms.py            the registry of forms, in matching order:
      lightning_file.py   a single .ckpt file (single device, DDP)
      hf/folder.py        a Hugging Face folder (any family with a transformers class; also
                          written by export --format hf), checked against its headers;
                          hf/tokens.py its special tokens carried whole, hf/draft.py the
                          self-speculative draft an export hands transformers' generate
      exported.py         model.safetensors + config.json (+ tokenizer.json)
      sharded/dcp.py      an FSDP2 folder (torch.distributed.checkpoint; sharded/dcp_reader.py reads it)
      sharded/zero.py     a DeepSpeed ZeRO-2/3 folder
    safety.py           weights-only reading of every pickled file; the proof
    loader.py           Checkpoint: opened, proven harmless and read once; load_decoder
    shape_check.py      a checkpoint's names and shapes against its config, before anything is built
    tokenizer_record.py the tokenizer a checkpoint records, finding it again
    folder.py           the checkpoint folder's crash-safe protocol (staging, publish, last.ckpt)
    resume.py           --resume: which checkpoint, and the recipe's optimizer settings
    safetensors_writer.py  a safetensors file written one tensor at a time
    export.py           `layerdrop export`

The Lightning callbacks that write checkpoints during a run (and the export every run ends
with) are the training loop's: framework/training/checkpointing/.

This package's front (what is imported here) needs neither Lightning nor a process
group: `layerdrop generate` and the eval commands load a checkpoint without either.
"""

from framework.checkpoint.base import CKPT_KEY, CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE, CheckpointError, Pieces
from framework.checkpoint.export import export_decoder
from framework.checkpoint.forms import FORM_NAMES, FORMS
from framework.checkpoint.loader import (Checkpoint, checkpoint_form, checkpoint_tensors, load_decoder, read_metadata,
                                         read_model_config)

__all__ = ["CheckpointError", "Checkpoint", "checkpoint_form", "checkpoint_tensors", "load_decoder", "read_model_config", "read_metadata",
           "export_decoder", "FORMS", "FORM_NAMES", "Pieces", "CKPT_KEY",
           "WEIGHTS_FILE", "CONFIG_FILE", "TOKENIZER_FILE"]
