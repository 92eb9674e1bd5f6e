"""``speculative``: self-speculative decoding (eval/decoding/speculative.py) with a draft
of the model's own layers (eval/decoding/drafts.py)."""

from eval.decoding.drafts import make_draft
from eval.decoding.modes import Mode
from eval.decoding.speculative import AdaptiveThreshold, SelfSpeculativeDecoder

DEFAULT_GAMMA = 5


def build(model, value, settings):
    draft = make_draft(settings.draft, len(model.blocks), settings.adapters)
    gamma = DEFAULT_GAMMA if settings.gamma is None else settings.gamma
    adaptive = AdaptiveThreshold() if settings.adaptive else None
    return SelfSpeculativeDecoder(model, draft, gamma=gamma, adaptive=adaptive, sampling=settings.sampling,
                                  seed=settings.seed, seed_by=settings.seed_by).generate_batch


MODE = Mode("speculative", "speculative",
            "self-speculative decoding: a draft proposes --gamma tokens (default 5), the full model verifies "
            "them in one forward; greedy output is identical to full, sampled output has its distribution. "
            "--draft exit:E | skip:SET | adapter:E; default: exit at E = round(L/3), or the adapter exit "
            "nearest L/3 with --adapters; --adaptive stops drafting on low draft confidence",
            build, reads=("draft", "gamma", "adaptive", "adapters"), order=30)
