"""Compiled decoding (`generate --compile`, `speculate run --compile`).

Every decoding route calls the model's one forward, ``Decoder.step``, with a few fixed
structural arguments (which blocks, which exits are read, an exit rule) and tensors whose
shapes change in two ways only: the cache grows by the tokens fed, and rows leave the batch.
At the CPU base model's size a step is mostly per-operation overhead, which one compiled
graph removes.

``CompiledStep`` stands in for the model's ``step``: each structural key (the blocks, the
exits and their adapters, whether the inputs are token ids or a residual stream) gets its
own ``torch.compile``'d function, with those arguments as constants of the function, so no
Python integer of the route becomes a symbolic value and the blocks unroll. Shapes are
dynamic: the growing cache length, a verify pass's gamma + 1 tokens and a shrinking batch
reuse one graph instead of compiling one per length. With ``static`` (the default on a GPU)
the decoding loops write a StaticKVCache (framework/model/static_kv_cache.py) instead: every
step attends to the whole fixed-size cache and reads its length from a device tensor, so its
graph has fixed shapes but for the rows and the cache size (marked dynamic), and on a GPU
inductor records it as a CUDA graph (what ``mode="reduce-overhead"`` sets), the launch cost of
every kernel gone; ``decoding_cache`` picks the cache. A call without a cache (training,
measurements), with a drop plan, keeping every state, or marking padding (the prefill: once
per prompt, and its padding check is a data-dependent branch) runs eagerly, exactly as
before, and so does a call with an exit rule (``leave``: a new rule each step would compile a
graph a token). The dynamic mode compiled therefore runs a token as steps of a few blocks,
one from each candidate exit to the next (``rows``: the rows still running; ``advance``
only on the last), and decides between them, in Python, which rows leave
(eval/decoding/dynamic_exit.py).

``fused`` compiles a function of several steps as one graph (a plain step with its head
and its choice, argmax or sampled draw; a speculative round's γ draft forwards with each
one's head and choice, and its verification), so a round pays two calls' fixed cost instead
of a call and an eager head per forward.

Each step is one graph (``fullgraph``): a route whose step would break into pieces runs
eagerly instead, counted in ``eager_fallbacks`` with the reason in ``graph_breaks``. Graphs
are counted per key and in all (``graphs``), and the wall time of every call that
compiled one is summed (``compile_seconds``: tracing and code generation, whole). Each key
may compile at most ``limit`` graphs; past it a key runs eagerly from then on, counted in
``eager_fallbacks``, so a route whose shapes keep changing costs compile time once, not per
token.
"""

from __future__ import annotations

import time
import types
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator

import torch
from torch.utils._pytree import tree_map

from framework.model.decoder import Decoder, StepOutput
from framework.model.kv_cache import KVCache

# Graphs one key may compile before it runs eagerly: under dynamo's own cap per code object
# (torch._dynamo.config.recompile_limit, 8), past which dynamo would fall back uncounted.
LIMIT = 6

# A decoding step at these sizes is mostly the cost of calling its kernels. No re-check of every
# input's size and stride inside the compiled code (dynamo's guards have checked them before the
# call) and, on a CPU, inductor's wrapper in C++ instead of Python cut a compiled step's time by
# about a quarter at the CPU base model (BENCHMARKS.md, "Compiled decoding"); the C++ wrapper
# costs compile time. Not tried on a GPU, which keeps inductor's Python wrapper.
INDUCTOR_OPTIONS = {"size_asserts": False}
CPU_INDUCTOR_OPTIONS = {**INDUCTOR_OPTIONS, "cpp_wrapper": True}


class CompiledStep:
    """``model.step``, compiled per route (see the module docstring); ``install`` puts it in place."""

    def __init__(self, model: Decoder, *, limit: int = LIMIT, backend: str | Callable = "inductor",
                 static: bool | None = None) -> None:
        if not (isinstance(limit, int) and limit >= 1):
            raise ValueError(f"limit={limit!r} is invalid: must be an integer >= 1")
        self.model, self.eager, self.limit, self.backend = model, model.step, limit, backend
        # static shapes (and on a GPU, CUDA graphs): by default where graphs can be recorded
        self.on_cuda = next(model.parameters()).is_cuda
        self.static = self.on_cuda if static is None else static
        self.functions: dict[tuple, Callable[..., StepOutput]] = {}
        self.graphs_by_key: dict[tuple, int] = {}
        self.graphs = 0
        self.compile_seconds = 0.0
        self.graph_breaks: dict[tuple, str] = {}  # key -> why its step could not be one graph

    @classmethod
    def install(cls, model: Decoder, **options: Any) -> "CompiledStep":
        """Replace ``model.step`` (an instance attribute over the class's method) by a
        CompiledStep and return it; ``uninstall`` puts the method back."""
        if isinstance(model.__dict__.get("step"), CompiledStep):
            return model.__dict__["step"]
        compiled = cls(model, **options)
        model.step = compiled  # type: ignore[method-assign]
        return compiled

    def uninstall(self) -> None:
        if self.model.__dict__.get("step") is self:
            del self.model.__dict__["step"]

    @classmethod
    @contextmanager
    def installed(cls, model: Decoder, **options: Any) -> Iterator["CompiledStep"]:
        """``install`` for a block of code; the method comes back after it unless a
        CompiledStep was in place before (then that one is used and stays)."""
        before = model.__dict__.get("step")
        compiled = cls.install(model, **options)
        try:
            yield compiled
        finally:
            if before is None:
                compiled.uninstall()

    def __call__(self, inputs: torch.Tensor, cache=None, *, layers=None, padding=None, plan=None, exits=None,
                 leave=None, states: bool = False, rows: torch.Tensor | None = None,
                 advance: bool = True) -> StepOutput:
        if cache is None or plan is not None or states or padding is not None or leave is not None:
            return self.eager(inputs, cache, layers=layers, padding=padding, plan=plan, exits=exits, leave=leave,
                              states=states, rows=rows, advance=advance)
        exits = dict(exits or {})
        layers = None if layers is None else tuple(int(i) for i in layers)
        key = (layers, tuple(sorted((k, id(a)) for k, a in exits.items())), inputs.dim(), rows is not None, advance)
        eager = self.eager

        def run_step(inputs: torch.Tensor, cache, rows: torch.Tensor | None) -> StepOutput:
            return eager(inputs, cache, layers=layers, exits=exits, rows=rows, advance=advance)

        return self._run(key, run_step, lambda: eager(inputs, cache, layers=layers, exits=exits, rows=rows,
                                                      advance=advance), inputs, cache, rows)

    def fused(self, key: tuple, function: Callable[..., Any], *args: Any) -> Any:
        """``function(forward, *args)`` compiled as one graph, ``forward`` being the model's eager
        step: several forwards and what lies between them (a greedy draft's γ steps, each
        one's head and argmax) pay the per-call cost of one compiled call instead of one
        each. ``key`` holds every object and constant the function closes over (objects
        themselves, not their ids: a key keeps them alive) — the first function given for a
        key is the one compiled and called from then on, so whatever varies between calls
        must come in ``args``. Past the key's graph limit, or if
        it breaks, ``function`` runs with this object as ``forward``: a compiled call per step."""
        eager = self.eager

        def run_fused(*args: Any) -> Any:
            return function(eager, *args)

        return self._run(("fused",) + tuple(key), run_fused, lambda: function(self, *args), *args)

    def _run(self, key: tuple, body: Callable[..., Any], fallback: Callable[[], Any], *args: Any) -> Any:
        """``body(*args)`` through the key's compiled function (compiled from ``body`` on the
        key's first call), or ``fallback()`` where the key runs eagerly."""
        static = any(isinstance(a, KVCache) and a.static for a in args)
        if static:  # fixed shapes: a graph of its own
            key = (*key, "static")
        if self.graphs_by_key.get(key, 0) > self.limit:
            return fallback()
        function = self.functions.get(key)
        if function is None:
            function = self.functions[key] = self._compile(key, body, static)
        # one stride pattern and offset 0 for every tensor, whatever view the caller holds
        args = tuple(a.clone(memory_format=torch.contiguous_format) if isinstance(a, torch.Tensor) else a
                     for a in args)
        if static:  # the batch may shrink: one graph for every row count (CUDA records one per count)
            for a in args:
                if isinstance(a, torch.Tensor) and a.dim():
                    torch._dynamo.maybe_mark_dynamic(a, 0)
        before = self.graphs
        started = time.perf_counter()
        try:
            # static: no dimension turns symbolic on a recompile but those marked (the default path pays nothing)
            with torch._dynamo.config.patch(automatic_dynamic_shapes=False) if static else nullcontext():
                out = function(*args)
        except torch._dynamo.exc.Unsupported as err:  # a graph break (found while tracing, before anything ran)
            self.graph_breaks[key] = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            self.graphs_by_key[key] = self.limit + 1
            out = fallback()
        if self.graphs > before or key in self.graph_breaks:
            self.compile_seconds += time.perf_counter() - started
        if static and self.on_cuda:  # a CUDA graph's outputs live in its pool: the next replay overwrites them
            out = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)
        return out

    @property
    def eager_fallbacks(self) -> int:
        """The keys that run eagerly: past their graph limit, or whose step broke into pieces."""
        return sum(count > self.limit for count in self.graphs_by_key.values())

    def summary(self) -> dict:
        return {"graphs": self.graphs, "routes": len(self.functions), "compile_seconds": self.compile_seconds,
                "eager_fallbacks": self.eager_fallbacks, "graph_breaks": sorted(set(self.graph_breaks.values()))}

    def _compile(self, key: tuple, body: Callable[..., Any], static: bool) -> Callable[..., Any]:
        """``body`` through torch.compile: with dynamic shapes, or for a static cache with
        fixed ones, recorded as CUDA graphs on a GPU (what ``mode="reduce-overhead"`` sets)."""
        def backend(graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
            self.graphs += 1
            self.graphs_by_key[key] = count = self.graphs_by_key.get(key, 0) + 1
            if count > self.limit:  # this key's shapes keep changing: the rest of its calls run eagerly
                return graph.forward
            if callable(self.backend):
                return self.backend(graph, example_inputs)
            from torch._dynamo.backends.registry import lookup_backend

            options = dict(INDUCTOR_OPTIONS if self.on_cuda else CPU_INDUCTOR_OPTIONS)
            if static and self.on_cuda:
                options["triton.cudagraphs"] = True
            with torch._inductor.config.patch(options):
                return lookup_backend(self.backend)(graph, example_inputs)

        # dynamo keeps compiled graphs (and caps their number) per code object: each key's function gets
        # its own, so keys and CompiledSteps do not share entries or the cap, and they go with this object.
        own = types.FunctionType(body.__code__.replace(), body.__globals__, body.__name__, None, body.__closure__)
        # static: the dimensions marked dynamic (rows, a cache's max_len) are the only symbols
        return torch.compile(own, dynamic=None if static else True, fullgraph=True, backend=backend)


def decoding_cache(model: Decoder, batch_size: int, max_len: int, *, extra_layers: int = 0,
                   static_shapes: bool = True) -> KVCache:
    """The cache a decoding loop writes: a static one (fixed shapes, the length a tensor)
    when a static CompiledStep is installed and the loop's steps keep their shapes
    (``static_shapes``: not dynamic exit's, whose rows leave at every exit), else the usual."""
    compiled = model.__dict__.get("step")
    static = static_shapes and isinstance(compiled, CompiledStep) and compiled.static
    return model.new_cache(batch_size, max_len, extra_layers=extra_layers, static=static)


__all__ = ["CompiledStep", "LIMIT", "decoding_cache"]
