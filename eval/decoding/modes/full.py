"""``full``: every block, every token."""

from eval.decoding.batch import BatchGenerator
from eval.decoding.modes import Mode
from eval.decoding.static_route import StaticRoute


def build(model, value, settings):
    return BatchGenerator(model, StaticRoute(model), sampling=settings.sampling, seed=settings.seed,
                          seed_by=settings.seed_by).generate


MODE = Mode("full", "full", "every block", build, order=0)
