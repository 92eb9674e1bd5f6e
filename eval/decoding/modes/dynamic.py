"""``dynamic``: per-token confident early exit (eval/decoding/dynamic_exit.py)."""

from eval.decoding.batch import BatchGenerator
from eval.decoding.dynamic_exit import DynamicExit, parse_candidates
from eval.decoding.modes import Mode

DEFAULT_THRESHOLD = 0.9


def build(model, value, settings):
    threshold = DEFAULT_THRESHOLD if settings.threshold is None else settings.threshold
    exits = settings.exits
    if isinstance(exits, str):  # --exits as written; a list is DynamicExit's to check
        exits = parse_candidates(exits, len(model.blocks))
    route = DynamicExit(model, threshold=threshold, exits=exits, adapters=settings.adapters)
    return BatchGenerator(model, route, sampling=settings.sampling, seed=settings.seed,
                          seed_by=settings.seed_by).generate


MODE = Mode("dynamic", "dynamic",
            "per-token confident early exit: a token leaves at the first candidate exit (--exits, each in "
            "1..L-1; default ~L/4, L/2, 3L/4, or the adapters' exits) whose head is confident (top-1 minus "
            "top-2 probability >= --threshold, default 0.9; 1 = never early, 0 = always at the first candidate)",
            build, reads=("threshold", "exits", "adapters"), order=40)
