"""get_dotted: a recipe's value at a dotted key, the default where a section or key is missing."""

from eval.experiments.sweep.dotted_keys import get_dotted


def test_values_at_dotted_keys_and_the_default_elsewhere():
    recipe = {"model": {"parametrization": {"lr": 0.004}, "decoder": 5}}
    assert get_dotted(recipe, "model.parametrization.lr") == 0.004
    assert get_dotted(recipe, "model.parametrization.tau_ema") is None
    assert get_dotted(recipe, "model.decoder.d_model", default=7) == 7  # a value, not a section
    assert get_dotted(recipe, "trainer.max_steps", 3) == 3
