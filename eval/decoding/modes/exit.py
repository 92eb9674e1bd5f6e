"""``exit:K``: an early exit after K blocks (0..K-1), through the exit adapter at K when
adapters are given (exit L is the full model, which needs none)."""

from eval.decoding.batch import BatchGenerator
from eval.decoding.modes import Mode
from eval.decoding.static_route import StaticRoute


def parse(value: str, spec: str, num_layers: int) -> int:
    k = int(value) if value.strip().isdigit() else None
    if k is None or not 1 <= k <= num_layers:
        raise ValueError(f"--mode {spec!r} is invalid: K must be in 1..{num_layers} (exit K runs blocks "
                         f"0..K-1; the model has {num_layers} layers)")
    return k


def build(model, k: int, settings):
    adapters, adapter = settings.adapters, None
    if adapters is not None and k != len(model.blocks):
        if k not in adapters.exits:
            raise ValueError(f"--mode exit:{k} has no adapter: the adapters' exits are {adapters.exits}")
        adapter = adapters.blocks[str(k)]
    route = StaticRoute(model, exit_layer=k, adapter=adapter)
    return BatchGenerator(model, route, sampling=settings.sampling, seed=settings.seed,
                          seed_by=settings.seed_by).generate


MODE = Mode("exit", "exit:K", "early exit after K blocks (K in 1..L); with --adapters, through the Balcony "
            "adapter at K", build, parse, reads=("adapters",), order=10)
