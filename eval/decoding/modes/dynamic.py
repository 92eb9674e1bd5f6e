"""``dynamic``: per-token confident early exit (eval/decoding/dynamic_exit.py)."""

from eval.decoding.batch import BatchGenerator
from eval.decoding.dynamic_exit import DynamicExit
from eval.decoding.modes import Mode

DEFAULT_THRESHOLD = 0.9


def candidate_exits(exits, num_layers: int) -> list[int] | None:
    """``--exits`` K,K (a string) or a list, as ints; their range is DynamicExit's to check."""
    if exits is None or not isinstance(exits, str):
        return None if exits is None else list(exits)
    try:
        return [int(e) for e in exits.split(",") if e.strip()]
    except ValueError:
        raise ValueError(f"--exits {exits!r} is invalid: candidate exits must be integers in 1..{num_layers - 1} "
                         f"(e.g. 1,{max(1, num_layers // 2)})") from None


def build(model, value, settings):
    threshold = DEFAULT_THRESHOLD if settings.threshold is None else settings.threshold
    route = DynamicExit(model, threshold=threshold, exits=candidate_exits(settings.exits, len(model.blocks)),
                        adapters=settings.adapters)
    return BatchGenerator(model, route, sampling=settings.sampling, seed=settings.seed,
                          seed_by=settings.seed_by).generate


MODE = Mode("dynamic", "dynamic",
            "per-token confident early exit: a token leaves at the first candidate exit (--exits, each in "
            "1..L-1; default ~L/4, L/2, 3L/4, or the adapters' exits) whose head is confident (top-1 minus "
            "top-2 probability >= --threshold, default 0.9; 1 = never early, 0 = always at the first candidate)",
            build, reads=("threshold", "exits", "adapters"), order=40)
