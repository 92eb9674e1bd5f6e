"""data.mixture: parsing with one-line refusals, one token language, phases of weights."""

import math
import re

import pytest

from framework.training.data.mixture import MixturePhases, Source, check_same_language, parse_mixture, parse_schedule


def test_weights_become_shares_in_the_given_order():
    sources = parse_mixture({"code": {"dir": "data/code/", "weight": 3}, "prose": {"dir": "data/prose", "weight": 1}})
    assert sources == [Source("code", "data/code", 0.75), Source("prose", "data/prose", 0.25)]


@pytest.mark.parametrize("weight", [0, -1, 0.0, math.nan, math.inf, -math.inf, True, "0.5", None])
def test_a_weight_that_is_not_a_positive_finite_number_is_refused(weight):
    with pytest.raises(ValueError, match=r"^data\.mixture\.b\.weight=.* must be a finite number > 0$"):
        parse_mixture({"a": {"dir": "x", "weight": 1}, "b": {"dir": "y", "weight": weight}})


def test_weights_whose_sum_overflows_are_refused():
    with pytest.raises(ValueError, match="sum to inf"):
        parse_mixture({"a": {"dir": "x", "weight": 1e308}, "b": {"dir": "y", "weight": 1e308}})


@pytest.mark.parametrize("mixture, message", [
    ({}, "at least one source"),
    ([{"dir": "x", "weight": 1}], "mapping of source name"),
    ({"a b": {"dir": "x", "weight": 1}}, "source name 'a b' is invalid"),
    ({"val/loss": {"dir": "x", "weight": 1}}, "source name 'val/loss' is invalid"),
    ({"a": {"dir": "x"}}, r"data\.mixture\.a=.* exactly \{dir: FOLDER, weight: W\}"),
    ({"a": {"dir": "x", "weight": 1, "seed": 2}}, r"exactly \{dir: FOLDER, weight: W\}"),
    ({"a": {"dir": "", "weight": 1}}, r"data\.mixture\.a\.dir='' is invalid"),
    ({"a": {"dir": 3, "weight": 1}}, r"data\.mixture\.a\.dir=3 is invalid"),
])
def test_malformed_mixtures_are_refused_in_one_line(mixture, message):
    with pytest.raises(ValueError, match=message) as error:
        parse_mixture(mixture)
    assert "\n" not in str(error.value)


def test_the_same_folder_twice_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(ValueError, match=r"data\.mixture\.b\.dir=.* source 'a' reads the same folder"):
        parse_mixture({"a": {"dir": str(tmp_path / "d"), "weight": 1},
                       "b": {"dir": str(tmp_path / "." / "d") + "/", "weight": 1}})


def _manifest(**tokenizer):
    return {"tokenizer": {"file": "tokenizer.json", "sha256": "aa", "eos_id": 0, "document_start": "eos", **tokenizer}}


@pytest.mark.parametrize("change, named", [(dict(sha256="bb"), "another tokenizer (sha256 of tokenizer.json)"),
                                           (dict(eos_id=2), "another tokenizer.eos_id"),
                                           (dict(document_start="bos"), "another tokenizer.document_start")])
def test_sources_must_share_one_tokenizer_and_document_convention(change, named):
    sources = [Source("code", "d/code", 0.5), Source("prose", "d/prose", 0.5)]
    check_same_language(sources, [_manifest(), _manifest()])
    with pytest.raises(ValueError, match=f"data.mixture.prose .*{re.escape(named)}.*--tokenizer d/code/tokenizer.json"):
        check_same_language(sources, [_manifest(), _manifest(**change)])


def test_phases_open_on_new_weights_and_close_the_last():
    first = [Source("code", "c", 0.3), Source("prose", "p", 0.7)]
    phases = MixturePhases()
    assert phases.begin(first, 0) is None
    assert phases.begin(first, 40) is None  # a resume with the same weights: the same phase
    note = phases.begin([Source("code", "c", 0.5), Source("prose", "p", 0.5)], 90)
    assert note == "data mixture: new weights from step 90 (phase 2): code 0.300 -> 0.500, prose 0.700 -> 0.500"
    assert MixturePhases(phases.state()).state() == [
        {"weights": {"code": 0.3, "prose": 0.7}, "start_step": 0, "end_step": 90},
        {"weights": {"code": 0.5, "prose": 0.5}, "start_step": 90, "end_step": None}]


def test_a_schedule_gives_each_step_range_its_weights():
    sources = [Source("code", "c", 0.3), Source("prose", "p", 0.7)]
    phases = parse_schedule([{"from_step": 90, "weights": {"code": 1, "prose": 9}}], sources)
    assert phases == [(0, sources), (90, [Source("code", "c", 0.1), Source("prose", "p", 0.9)])]


@pytest.mark.parametrize("schedule, message", [
    ([], "at least one"),
    ([{"from_step": 0, "weights": {"code": 1, "prose": 1}}], r"from_step=0 is invalid: .* > 0"),
    ([{"from_step": 5, "weights": {"code": 1, "prose": 1}}, {"from_step": 5, "weights": {"code": 1, "prose": 1}}],
     r"\[1\]\.from_step=5 is invalid"),
    ([{"from_step": 5, "weights": {"code": 1}}], "give a weight for each source of data.mixture"),
    ([{"from_step": 5, "weights": {"code": 1, "prose": 0}}], r"data\.mixture\.prose\.weight=0 is invalid"),
    ([{"from_step": 5}], "give exactly"),
    ([{"from_step": 2.5, "weights": {"code": 1, "prose": 1}}], "from_step=2.5 is invalid"),
])
def test_a_bad_schedule_is_one_line(schedule, message):
    with pytest.raises(ValueError, match=message) as error:
        parse_schedule(schedule, [Source("code", "c", 0.3), Source("prose", "p", 0.7)])
    assert "\n" not in str(error.value)
