"""lm-evaluation-harness model `layerdrop`: a checkpoint of this project under lm-eval.

    import eval.lm_eval_adapter  # registers the model name
    lm_eval.simple_evaluate(model="layerdrop",
                            model_args={"ckpt": "runs/tiny/checkpoints/last.ckpt", "exit_layer": 4},
                            tasks=["piqa"])

Model arguments (in an lm-eval argument string, separate skip layers with ';'):
    ckpt | pretrained   a .ckpt from `layerdrop pretrain` or an exported folder (required)
    tokenizer           a tokenizer.json (default: found beside the checkpoint, or the
                        data folder its training run read; see ``find_tokenizer``)
    exit_layer          run blocks 0..k-1 only (early exit), 1..L
    skip_layers         a skip set: alternate-odd, 2-5, 1;3;5, … (eval/skip_sets.py)
    batch_size          sequences per forward for log-likelihoods (default 8)
    max_batch_size      caps batch_size
    device              cpu, cuda, cuda:N (default: cuda if available)
    max_length          context window in tokens (default: the model's max_seq_len)
    max_gen_toks        default generation budget when a task gives none (256)
    eot_token           the end-of-text token (default: the data manifest's EOS, else
                        the first usual EOS name the vocabulary holds)

Log-likelihoods go through framework.multiple_choice.score_continuations, the same
scorer as the native multiple-choice metric. Generation is greedy, one request at a
time with the KV cache (the decoder has no padding mask, so prompts of different
lengths are not batched), stopping at EOS, at any ``until`` string, or after
``max_gen_toks`` tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tokenizers import Tokenizer
from tqdm import tqdm

from eval.skip_sets import parse_skip_set
from framework.checkpoint import load_decoder
from framework.multiple_choice import score_continuations

TOKENIZER_FILE = "tokenizer.json"
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "<|im_end|>", "<|eot_id|>")
# Sampling filters: they only act when do_sample is true (Hugging Face semantics), which
# the adapter refuses, so with greedy decoding they are moot.
_GREEDY_NEUTRAL = ("top_p", "top_k")


def training_data_dir(ckpt: Path) -> Path | None:
    """The data folder a Lightning checkpoint's run trained on (its datamodule's
    hyperparameters), read without materialising the weights."""
    if ckpt.is_dir() or not ckpt.is_file():
        return None
    try:
        saved = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a readable checkpoint: load_decoder reports why
        return None
    data_dir = (saved.get("datamodule_hyper_parameters") or {}).get("data_dir") if isinstance(saved, dict) else None
    return Path(data_dir) if isinstance(data_dir, str) else None


def find_tokenizer(ckpt: str | Path) -> tuple[Path, int | None]:
    """(tokenizer.json, the EOS id the training data recorded, or None) for a checkpoint
    of any form, from any working directory: framework.checkpoint.find_tokenizer."""
    from framework.checkpoint import find_tokenizer as find
    from framework.checkpoint_tokenizer import tokenizer_record

    path = find(ckpt)
    eos_id = tokenizer_record(ckpt).get("eos_id")
    if eos_id is None and (path.parent / "manifest.json").is_file():  # found in a prepared data folder
        eos_id = json.loads((path.parent / "manifest.json").read_text()).get("tokenizer", {}).get("eos_id")
    return path, eos_id


def eos_id_of(tokenizer: Tokenizer, requested: str | None) -> int:
    if requested is not None:
        token_id = tokenizer.token_to_id(requested)
        if token_id is None:
            raise ValueError(f"eot_token={requested!r} is not in the tokenizer's vocabulary")
        return token_id
    for name in EOS_CANDIDATES:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return token_id
    raise ValueError(f"the tokenizer has none of the usual end-of-text tokens ({', '.join(EOS_CANDIDATES)}); "
                     "name yours with eot_token=")


def _positive_int(name: str, value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or number < 1 or str(number) != str(value).strip():
        raise ValueError(f"{name}={value!r} is invalid: must be a positive integer")
    return number


def _layer_number(value: Any, num_layers: int) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"exit_layer={value!r} is invalid: must be an integer in 1..{num_layers}") from None


@register_model("layerdrop")
class LayerDropLM(TemplateLM):
    """A layerdrop Decoder (optionally early-exited or with layers skipped) for lm-eval."""

    def __init__(self, ckpt: str | None = None, pretrained: str | None = None, tokenizer: str | None = None,
                 exit_layer: int | str | None = None, skip_layers: Any = None, batch_size: int | str = 8,
                 max_batch_size: int | str | None = None, device: str | None = None,
                 max_length: int | str | None = None, max_gen_toks: int | str = 256,
                 eot_token: str | None = None) -> None:
        super().__init__()
        path = ckpt or pretrained
        if not path:
            raise ValueError("the layerdrop model needs ckpt=PATH (a .ckpt or an exported folder)")
        if str(batch_size) == "auto":
            raise ValueError("batch_size='auto' is not supported by the layerdrop model: give a number")
        self.batch_size = _positive_int("batch_size", batch_size)
        if max_batch_size is not None:
            self.batch_size = min(self.batch_size, _positive_int("max_batch_size", max_batch_size))
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.decoder, self.model_cfg = load_decoder(path, map_location=self._device)
        n = self.model_cfg.n_layers
        self.exit_layer = None if exit_layer in (None, "", "None") else _layer_number(exit_layer, n)
        self.skip_layers = () if skip_layers in (None, "", "None") else parse_skip_set(skip_layers, n)
        self.decoder.active_layers(self.exit_layer, self.skip_layers)  # validates both
        tokenizer_path, manifest_eos = (Path(tokenizer), None) if tokenizer else find_tokenizer(path)
        if not tokenizer_path.is_file():
            raise ValueError(f"tokenizer={str(tokenizer_path)!r} does not exist")
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self._eot_token_id = manifest_eos if (manifest_eos is not None and eot_token is None) \
            else eos_id_of(self.tokenizer, eot_token)
        self._max_length = _positive_int("max_length", max_length) if max_length else self.model_cfg.max_seq_len
        self.max_gen_toks = _positive_int("max_gen_toks", max_gen_toks)
        self.info = {"ckpt": str(path), "tokenizer": str(tokenizer_path), "exit_layer": self.exit_layer,
                     "skip_layers": list(self.skip_layers), "num_layers": n,
                     "parameters": self.decoder.num_parameters()}

    # ------------------------------------------------------------ tokenizer
    @property
    def eot_token_id(self) -> int:
        return self._eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return self.info["tokenizer"]

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        # Our tokenizers add nothing; documents in training were separated by EOS only,
        # which lm-eval's prefix token (eot_token_id) reproduces.
        return self.tokenizer.encode(string, add_special_tokens=False).ids

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    def get_model_info(self) -> dict:
        return dict(self.info)

    # ------------------------------------------------------------ log-likelihoods
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        scored = [i for i, (_, _, continuation) in enumerate(requests) if continuation]
        values = score_continuations(self.decoder, [(requests[i][1], requests[i][2]) for i in scored],
                                     batch_size=self.batch_size, max_length=self.max_length,
                                     exit_layer=self.exit_layer, skip_layers=self.skip_layers)
        results: list[tuple[float, bool]] = [(0.0, True)] * len(requests)  # empty continuation: log 1
        for i, value in zip(scored, values):
            results[i] = value
        for (key, _, _), value in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, value)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Σ log p of each whole string, in disjoint windows of at most max_length tokens
        that each predict new tokens only (lm-eval's rolling windows, context_len=1)."""
        windows, owners = [], []
        for number, (string,) in enumerate(req.args for req in requests):
            for context, continuation in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, context, continuation))
                owners.append(number)
        totals = [0.0] * len(requests)
        for owner, (loglikelihood, _) in zip(owners, self._loglikelihood_tokens(windows)):
            totals[owner] += loglikelihood
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ------------------------------------------------------------ generation
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        outputs = []
        for req in tqdm(requests, desc="generate_until", disable=disable_tqdm):
            context, gen_kwargs = req.args
            until, max_new = self._generation_args(gen_kwargs)
            text = self.greedy_text(context, until, max_new)
            self.cache_hook.add_partial("generate_until", req.args, text)
            outputs.append(text)
        return outputs

    def _generation_args(self, gen_kwargs: dict) -> tuple[list[str], int]:
        kwargs = dict(gen_kwargs or {})
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = _positive_int("max_gen_toks", kwargs.pop("max_gen_toks", self.max_gen_toks))
        do_sample = bool(kwargs.pop("do_sample", False))
        temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
        num_beams = int(kwargs.pop("num_beams", 1) or 1)
        if do_sample or temperature > 0 or num_beams != 1:
            raise ValueError(f"do_sample={do_sample}, temperature={temperature}, num_beams={num_beams}: the "
                             "layerdrop model decodes greedily only (do_sample=false, temperature=0, num_beams=1)")
        unknown = sorted(k for k in kwargs if k not in _GREEDY_NEUTRAL)
        if unknown:
            allowed = ", ".join(("until", "max_gen_toks", "do_sample=false", "temperature=0", "num_beams=1")
                                + _GREEDY_NEUTRAL)
            raise ValueError(f"generation arguments {unknown} are not supported by the layerdrop model; "
                             f"allowed: {allowed}")
        if max_new >= self.max_length:
            raise ValueError(f"max_gen_toks={max_new} leaves no room for a prompt in max_length={self.max_length}")
        return until, max_new

    @torch.no_grad()
    def greedy_tokens(self, prompt: list[int], max_new: int, until: list[str] = ()) -> list[int]:
        """Greedy continuation of ``prompt`` with the KV cache (prefill, then one token a
        step); stops after EOS (not returned), once a stop string appears, or at max_new."""
        prompt = (prompt or [self.prefix_token_id])[-(self.max_length - max_new):]
        cache = self.decoder.new_cache(1, len(prompt) + max_new)
        run = dict(exit_layer=self.exit_layer, skip_layers=self.skip_layers, cache=cache)
        logits = self.decoder(torch.tensor([prompt], device=self._device), **run)
        generated: list[int] = []
        while len(generated) < max_new:
            token = int(logits[0, -1].argmax())
            if token == self.eot_token_id:
                break
            generated.append(token)
            if until and any(stop in self.tok_decode(generated) for stop in until):
                break
            if len(generated) < max_new:
                logits = self.decoder(torch.tensor([[token]], device=self._device), **run)
        return generated

    def greedy_text(self, context: str, until: list[str], max_new: int) -> str:
        text = self.tok_decode(self.greedy_tokens(self.tok_encode(context), max_new, until))
        for stop in until:
            if stop:
                text = text.split(stop, 1)[0]
        return text


__all__ = ["LayerDropLM", "find_tokenizer", "training_data_dir", "eos_id_of"]
