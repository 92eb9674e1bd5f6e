"""lm-evaluation-harness model `layerdrop`: a checkpoint of this project under lm-eval.

    import eval.downstream.lm_eval_adapter  # registers the model name
    lm_eval.simple_evaluate(model="layerdrop",
                            model_args={"ckpt": "runs/tiny/checkpoints/last.ckpt", "exit_layer": 4},
                            tasks=["piqa"])

Model arguments (in an lm-eval argument string, separate skip layers with ';'):
    ckpt | pretrained   a .ckpt from `layerdrop pretrain` or an exported folder (required)
    tokenizer           a tokenizer.json (default: found beside the checkpoint, or the
                        data folder its training run read; see framework/tokenizer.py)
    exit_layer          early exit K: run blocks 0..K-1 only (K in 1..L)
    skip_layers         a skip set of block indices 0..L-1: alternate-odd, 2-5, 1;3;5, …
    adapters            a folder from `layerdrop adapters fit`: exit_layer K reads its exit
                        through the adapter trained at K
    batch_size          sequences per forward (log-likelihoods and generation; default 8)
    max_batch_size      caps batch_size
    device              cpu, cuda, cuda:N (default: cuda if available)
    max_length          context window in tokens (default: the model's max_seq_len)
    max_gen_toks        generation budget when a task gives none (default: 256, at most
                        half of max_length)
    eot_token           the end-of-text token (default: the data manifest's EOS, else
                        the first usual EOS name the vocabulary holds)
    seed                seed of sampled generation (default 0)

Log-likelihoods go through eval.downstream.multiple_choice.score_continuations, the same scorer
as the native multiple-choice metric; after ``share_exits([1, 2, ...])`` they are scored at
every one of those exits from one forward (``score_exits``; exit adapters read the same
forward, each skip set runs its own) and ``use_exit(K)`` / ``use_column`` picks the
column lm-eval reads (`eval downstream --exit-layers`, `--sets`). A continuation longer than
max_length is scored over its last max_length tokens (one warning). Generation goes through the same batched
generator as `layerdrop generate` (the mode registry, eval/decoding/modes/: exit:K,
skip:SET or full, from exit_layer/skip_layers): requests with the same
generation arguments decode together, left-padded, with the KV cache, stopping at EOS,
at any ``until`` string, or after ``max_gen_toks``; greedy unless the task asks for
sampling (``do_sample``, ``temperature``, ``top_k``, ``top_p``). Contexts longer than
max_length keep their last tokens, as everywhere in this project, with one warning.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from eval.decoding import modes
from eval.decoding.sampling import Sampling
from eval.decoding.transcripts import StopStrings
from eval.downstream.multiple_choice import score_continuations, score_exits
from eval.skip_sets import parse_skip_set
from framework.tokenizer import TextCodec
from framework.checkpoint import Checkpoint
from framework.checkpoint import load_decoder
from framework.console.loop_progress import progress

log = logging.getLogger(__name__)
_SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p")


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
    """A layerdrop Decoder (optionally early-exited, with an exit adapter, or with layers
    skipped) for lm-eval."""

    def __init__(self, ckpt: str | None = None, pretrained: str | None = None, tokenizer: str | None = None,
                 exit_layer: int | str | None = None, skip_layers: Any = None, adapters: str | None = None,
                 batch_size: int | str = 8, max_batch_size: int | str | None = None, device: str | None = None,
                 max_length: int | str | None = None, max_gen_toks: int | str | None = None,
                 eot_token: str | None = None, seed: int | str = 0) -> None:
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
        opened = Checkpoint.open(path)  # one open for the weights and the tokenizer
        self.decoder, self.model_cfg = load_decoder(opened, map_location=self._device)
        n = self.model_cfg.n_layers
        self.exit_layer = None if exit_layer in (None, "", "None") else _layer_number(exit_layer, n)
        self.skip_layers = () if skip_layers in (None, "", "None") else parse_skip_set(skip_layers, n)
        self.decoder.active_layers(self.exit_layer, self.skip_layers)  # validates both
        if self.exit_layer is not None and self.skip_layers:
            raise ValueError(f"exit_layer={self.exit_layer} and skip_layers={list(self.skip_layers)} are exclusive: "
                             "a decoding mode is either an early exit or a skip set")
        self.mode = modes.parse(self._mode_spec(), n)
        self.adapter = self._adapter(adapters)
        self.codec = TextCodec.for_checkpoint(opened, tokenizer, eot_token)
        self.tokenizer = self.codec.tokenizer
        self._max_length = _positive_int("max_length", max_length) if max_length else self.model_cfg.max_seq_len
        self.max_gen_toks = (_positive_int("max_gen_toks", max_gen_toks) if max_gen_toks is not None
                             else min(256, self._max_length // 2))
        if self.max_gen_toks >= self._max_length:
            raise ValueError(f"max_gen_toks={self.max_gen_toks} is invalid: must be below max_length="
                             f"{self._max_length}, which also holds the prompt")
        self.seed = int(seed)
        self._warned: set[str] = set()
        self.info = {"ckpt": str(path), "tokenizer": str(self.codec.path), "exit_layer": self.exit_layer,
                     "skip_layers": list(self.skip_layers), "adapters": adapters, "num_layers": n,
                     "parameters": self.decoder.num_parameters()}
        self.exit_scores: ExitScores | None = None
        self.column: tuple[str, Any] | None = None  # what use_column picked

    def share_exits(self, exits: list[int], *, skip_sets: list[tuple[int, ...]] = (), adapters=None,
                    adapter_exits: list[int] = ()) -> None:
        """Score log-likelihoods at every exit in ``exits`` from one forward (the first
        request computes them all, the same request at another exit is read back); exit
        adapters (``adapters``, an ExitAdapters, at ``adapter_exits``) read the same
        forward's states. Each skip set in ``skip_sets`` runs its own forward (its blocks
        see another stream than the plain model's). ``use_exit(K)`` / ``use_column(...)``
        then pick what lm-eval sees. Generation still runs per column."""
        if self.skip_layers or self.adapter is not None:
            raise ValueError("sharing exits runs plain early exits: no skip_layers, no adapters")
        n = self.model_cfg.n_layers
        for k in exits:
            self.decoder.active_layers(k)
        skip_sets = [parse_skip_set(skip, n) for skip in skip_sets]
        adapter_exits = sorted(set(adapter_exits))
        missing = [k for k in adapter_exits if adapters is None or k not in adapters.exits]
        if missing:
            raise ValueError(f"adapter exits {missing} have no adapter: the adapters' exits are "
                             f"{None if adapters is None else adapters.exits}")
        self.adapters = adapters
        self.exit_scores = ExitScores(self.decoder, sorted(set(exits)), self.batch_size, self.max_length,
                                      adapters={k: adapters.blocks[str(k)] for k in adapter_exits},
                                      skip_sets=skip_sets)

    def use_exit(self, exit_layer: int) -> None:
        self.use_column(("exit", exit_layer))

    def use_column(self, column: tuple[str, Any]) -> None:
        """What lm-eval sees next: ``("exit", K)``, ``("adapter", K)`` or ``("skip", (i, j, ...))``,
        one of the columns ``share_exits`` set up."""
        if self.exit_scores is None or column not in self.exit_scores.columns:
            raise ValueError(f"{column} is not among the shared columns; call share_exits first")
        kind, value = column
        self.exit_layer = None if kind == "skip" else value
        self.skip_layers = tuple(value) if kind == "skip" else ()
        self.adapter = self.adapters.blocks[str(value)] if kind == "adapter" else None
        self.column = column
        self.mode = modes.parse(self._mode_spec(), self.model_cfg.n_layers)
        self.info.update(exit_layer=self.exit_layer, skip_layers=list(self.skip_layers))

    def _adapter(self, adapters: str | None):
        if adapters in (None, "", "None"):
            return None
        from eval.adapters.exit_adapters import load_adapters

        loaded, _ = load_adapters(adapters, self.decoder)
        if self.exit_layer not in loaded.exits or self.skip_layers:
            raise ValueError(f"adapters={adapters!r} need exit_layer set to one of their exits {loaded.exits} "
                             "(and no skip_layers)")
        self.adapters = loaded
        return loaded.blocks[str(self.exit_layer)]

    def _mode_spec(self) -> str:
        if self.exit_layer is not None:
            return f"exit:{self.exit_layer}"
        return f"skip:{','.join(map(str, self.skip_layers))}" if self.skip_layers else "full"

    def _decode(self, sampling: Sampling):
        """The registry's decoder of this model's mode (``generate(prompts, max_new, ...)``)."""
        mode, value = self.mode
        adapters = self.adapters if self.adapter is not None else None
        return mode.build(self.decoder, value, modes.Settings(sampling=sampling, seed=self.seed, adapters=adapters))

    # ------------------------------------------------------------ tokenizer
    @property
    def eot_token_id(self) -> int:
        return self.codec.eos_id

    @property
    def prefix_token_id(self) -> int:
        # what stands before a text with no context: BOS for a model that starts documents with one
        return self.codec.start_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return self.info["tokenizer"]

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        # Our tokenizers add nothing; documents in training were separated by EOS only,
        # which lm-eval's prefix token (eot_token_id) reproduces.
        return self.codec.encode(string)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.codec.decode(tokens)

    def get_model_info(self) -> dict:
        return dict(self.info)

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning(message)

    # ------------------------------------------------------------ log-likelihoods
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        # lm-eval asks with False, so TemplateLM's "Tokenizing inputs" bar drew into logs; None
        # is tqdm's own "only on a terminal", and our progress below reads it as on.
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or None)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        scored = [i for i, (_, _, continuation) in enumerate(requests) if continuation]
        pairs = [self._fitting(requests[i][1], requests[i][2]) for i in scored]
        what = "eval downstream: log-likelihood requests"
        if self.exit_scores is not None:
            values = self.exit_scores.scores(pairs, self.column, what if not disable_tqdm else None)
        else:
            with progress(len(scored), what, enabled=not disable_tqdm) as bar:
                values = score_continuations(self.decoder, pairs, batch_size=self.batch_size,
                                             max_length=self.max_length, exit_layer=self.exit_layer,
                                             skip_layers=self.skip_layers, adapter=self.adapter,
                                             on_batch=bar.advance)
        results: list[tuple[float, bool]] = [(0.0, True)] * len(requests)  # empty continuation: log 1
        for i, value in zip(scored, values):
            results[i] = value
        for (key, _, _), value in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, value)
        return results

    def _fitting(self, context: list[int], continuation: list[int]) -> tuple[list[int], list[int]]:
        """A continuation longer than the window is scored over its last max_length tokens,
        its first ones read as context (a model cannot score more than its window at once)."""
        if len(continuation) <= self.max_length:
            return context, continuation
        self._warn_once(f"continuations longer than max_length {self.max_length} tokens are scored over their "
                        "last max_length tokens only (pass a larger --max-length to score them whole)")
        cut = len(continuation) - self.max_length
        return list(context) + list(continuation[:cut]), list(continuation[cut:])

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
        for owner, (loglikelihood, _) in zip(owners, self._loglikelihood_tokens(windows, disable_tqdm)):
            totals[owner] += loglikelihood
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ------------------------------------------------------------ generation
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Requests with the same generation arguments decode together, batch_size at a time."""
        groups: dict[tuple, list[int]] = {}
        settings = []
        for number, req in enumerate(requests):
            until, max_new, sampling = self._generation_args(req.args[1])
            key = (tuple(until), max_new, sampling)
            groups.setdefault(key, []).append(number)
            settings.append(key)
        outputs: list[str] = [""] * len(requests)
        with progress(len(requests), "eval downstream: generation requests", enabled=not disable_tqdm) as bar:
            for (until, max_new, sampling), members in groups.items():
                decode = self._decode(sampling)
                stop = StopStrings(list(until), self.tok_decode)
                for start in range(0, len(members), self.batch_size):
                    chunk = members[start:start + self.batch_size]
                    prompts = [self._context(requests[i].args[0], max_new) for i in chunk]
                    items, _ = decode(prompts, max_new, eos_id=self.codec.stop_ids, stop=stop, numbers=chunk)
                    for i, item in zip(chunk, items):
                        outputs[i] = stop.cut(self.tok_decode(item.tokens))
                        self.cache_hook.add_partial("generate_until", requests[i].args, outputs[i])
                    bar.advance(len(chunk))
        return outputs

    def _context(self, context: str, max_new: int) -> list[int]:
        ids = self.tok_encode(context) or [self.prefix_token_id]
        room = self.max_length - max_new
        if len(ids) > room:
            self._warn_once(f"generate_until: contexts longer than max_length {self.max_length} minus "
                            f"max_gen_toks {max_new} keep their last {room} tokens")
            ids = ids[-room:]
        return ids

    def _generation_args(self, gen_kwargs: dict) -> tuple[list[str], int, Sampling]:
        kwargs = dict(gen_kwargs or {})
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = _positive_int("max_gen_toks", kwargs.pop("max_gen_toks", self.max_gen_toks))
        if max_new >= self.max_length:
            cap = self.max_length // 2
            self._warn_once(f"max_gen_toks={max_new} does not fit max_length={self.max_length} with a prompt: "
                            f"generating at most {cap} tokens")
            max_new = cap
        num_beams = int(kwargs.pop("num_beams", 1) or 1)
        if num_beams != 1:
            raise ValueError(f"num_beams={num_beams} is not supported by the layerdrop model (greedy or sampling)")
        sampling = self._sampling({k: kwargs.pop(k) for k in _SAMPLING_KEYS if k in kwargs})
        if kwargs:
            allowed = ", ".join(("until", "max_gen_toks", "num_beams=1") + _SAMPLING_KEYS)
            raise ValueError(f"generation arguments {sorted(kwargs)} are not supported by the layerdrop model; "
                             f"allowed: {allowed}")
        return until, max_new, sampling

    @staticmethod
    def _sampling(kwargs: dict) -> Sampling:
        """Hugging Face's semantics: sampling when do_sample is true (or unset with a
        temperature > 0); top_k/top_p only filter a sampled distribution."""
        temperature = float(kwargs.get("temperature") or 0.0)
        do_sample = kwargs.get("do_sample")
        if do_sample is None:
            do_sample = temperature > 0
        if not do_sample:
            return Sampling()
        top_k = kwargs.get("top_k")
        top_p = kwargs.get("top_p")
        return Sampling(temperature=temperature or 1.0, top_k=int(top_k) if top_k else None,
                        top_p=float(top_p) if top_p is not None and float(top_p) != 1.0 else None)

    def greedy_tokens(self, prompt: list[int], max_new: int, until: list[str] = ()) -> list[int]:
        """Greedy continuation of one prompt (stops after EOS, not returned, a stop string,
        or ``max_new`` tokens)."""
        context = (prompt or [self.prefix_token_id])[-(self.max_length - max_new):]
        items, _ = self._decode(Sampling())([context], max_new, eos_id=self.codec.stop_ids,
                                            stop=StopStrings(list(until), self.tok_decode))
        return items[0].tokens


class ExitScores:
    """Log-likelihoods of several columns, computed together and kept by (context,
    continuation): plain exits ``("exit", K)`` and adapter exits ``("adapter", K)`` from
    one shared forward, each skip set ``("skip", S)`` from a forward of its own."""

    def __init__(self, decoder: torch.nn.Module, exits: list[int], batch_size: int, max_length: int, *,
                 adapters: dict[int, torch.nn.Module] | None = None, skip_sets: list[tuple[int, ...]] = ()) -> None:
        self.decoder, self.exits, self.batch_size, self.max_length = decoder, exits, batch_size, max_length
        self.adapters = dict(adapters or {})
        self.shared = [("exit", k) for k in exits] + [("adapter", k) for k in sorted(self.adapters)]
        self.columns = self.shared + [("skip", tuple(s)) for s in skip_sets]
        self.table: dict[tuple, dict[tuple, tuple[float, bool]]] = {column: {} for column in self.columns}
        self.pairs_scored = 0  # by the shared forward, each once for every exit and adapter exit
        self.skip_pairs_scored = 0  # by the skip sets' forwards, summed over the sets

    def scores(self, pairs: list[tuple[list[int], list[int]]], column: tuple, what: str | None):
        keys = [(tuple(context), tuple(continuation)) for context, continuation in pairs]
        table = self.table[column]
        new = list(dict.fromkeys(key for key in keys if key not in table))
        if new:
            listed = [(list(c), list(t)) for c, t in new]
            if column[0] == "skip":
                with progress(len(new), f"{what} (skip set {','.join(map(str, column[1]))})",
                              enabled=what is not None) as bar:
                    table.update(zip(new, score_continuations(self.decoder, listed, batch_size=self.batch_size,
                                                              max_length=self.max_length, skip_layers=column[1],
                                                              on_batch=bar.advance)))
                self.skip_pairs_scored += len(new)
            else:
                names = [f"{kind} {k}" if kind == "adapter" else str(k) for kind, k in self.shared]
                with progress(len(new), f"{what} (exits {','.join(names)} in one pass)",
                              enabled=what is not None) as bar:
                    found = score_exits(self.decoder, listed, self.exits, adapters=self.adapters,
                                        batch_size=self.batch_size, max_length=self.max_length, on_batch=bar.advance)
                for key, values in found.items():
                    self.table[key if isinstance(key, tuple) else ("exit", key)].update(zip(new, values))
                self.pairs_scored += len(new)
        return [table[key] for key in keys]


__all__ = ["LayerDropLM", "ExitScores"]
