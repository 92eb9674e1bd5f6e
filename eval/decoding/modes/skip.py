"""``skip:SET``: the blocks of SET passed through by the residual (eval/skip_sets.py's specs)."""

from eval.decoding.batch import BatchGenerator
from eval.decoding.modes import Mode
from eval.decoding.static_route import StaticRoute
from eval.skip_sets import parse_skip_set


def parse(value: str, spec: str, num_layers: int) -> tuple[int, ...]:
    return parse_skip_set(value, num_layers)


def build(model, skip: tuple[int, ...], settings):
    route = StaticRoute(model, skip_layers=skip)
    return BatchGenerator(model, route, sampling=settings.sampling, seed=settings.seed,
                          seed_by=settings.seed_by).generate


MODE = Mode("skip", "skip:SET", "the blocks of SET passed through (2,5 / 1-3 / alternate-odd)", build, parse,
            order=20)
