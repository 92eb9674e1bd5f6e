import pytest

from eval.skip_sets import (describe, order_by_params_kept, params_kept, parse_skip_set, resolve_sets,
                            sweep_sets)
from framework.config import ModelConfig
from framework.model.decoder import Decoder


@pytest.mark.parametrize("spec, expected", [
    ("none", ()),
    ("alternate-odd", (1, 3, 5)),
    ("alternate-even", (0, 2, 4)),
    ("2-4", (2, 3, 4)),
    ("3-3", (3,)),
    ("5,1,3", (1, 3, 5)),
    ("1;4", (1, 4)),
    ("1+4", (1, 4)),
    ("2", (2,)),
    ([4, 1, 1], (1, 4)),
])
def test_specs_name_the_expected_sets(spec, expected):
    assert parse_skip_set(spec, 7 if spec == "alternate-odd" else 6) == expected


@pytest.mark.parametrize("spec, message", [
    ("6", r"layers \[6\] are outside 0..5"),
    ("4-9", r"outside 0..5"),
    ([-1, 2], r"layers \[-1\] are outside 0..5"),
    ("5-2", "a range a-b needs a <= b"),
    ("odd", "allowed: none, alternate-odd, alternate-even"),
    ("0-5", "skips all 6 layers"),
])
def test_bad_specs_raise_naming_the_value(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_skip_set(spec, 6)


def test_middle_sweep_grows_from_the_centre_and_keeps_the_ends():
    sets = sweep_sets("middle", 8)
    assert [len(s) for s in sets] == [1, 2, 3, 4, 5, 6]
    for skip in sets:
        assert 0 not in skip and 7 not in skip
        assert skip == tuple(range(skip[0], skip[-1] + 1))
    assert sets[1] == (3, 4)


def test_contiguous_and_single_sweeps_enumerate_every_set():
    n = 5
    contiguous = sweep_sets("contiguous", n)
    assert len(contiguous) == n * (n + 1) // 2 - 1  # every range except the whole model
    assert len(set(contiguous)) == len(contiguous)
    assert sweep_sets("single", n) == [(i,) for i in range(n)]
    with pytest.raises(ValueError, match="allowed: alternate, single, middle, contiguous"):
        sweep_sets("random", n)


def test_resolve_keeps_first_occurrence_and_deduplicates():
    sets = resolve_sets(["none", "alternate-odd", "1,3"], ["alternate", "single"], 4)
    assert sets[:3] == [(), (1, 3), (0, 2)]
    assert len(sets) == len(set(sets)) == 3 + 4


def test_params_kept_equals_a_model_built_without_those_blocks():
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=5, n_heads=4, max_seq_len=16)
    decoder = Decoder(cfg)
    for skip in [(), (1,), (0, 2, 4), (1, 2, 3)]:
        smaller = Decoder(ModelConfig(**{**cfg.to_dict(), "n_layers": cfg.n_layers - len(skip)}))
        assert params_kept(decoder, skip) == smaller.num_parameters()


def test_results_are_ordered_by_parameters_kept():
    rows = [{"skip_layers": [1, 2], "params_kept": 10}, {"skip_layers": [], "params_kept": 30},
            {"skip_layers": [3], "params_kept": 20}, {"skip_layers": [0], "params_kept": 20}]
    ordered = order_by_params_kept(rows)
    assert [r["skip_layers"] for r in ordered] == [[], [0], [3], [1, 2]]


def test_describe_names_sets_for_plots():
    assert describe((), 6) == "none"
    assert describe((1, 3, 5), 6) == "alternate-odd"
    assert describe((2, 3, 4), 6) == "2-4"
    assert describe((1, 4), 6) == "1,4"
