"""Fixtures of the adapter tests: the suite's prepared tokens and a trained backbone."""

import pytest

from tests.eval.adapters.backbones import trained_backbone


@pytest.fixture(scope="module")
def prepared(prepared_tokens):
    return prepared_tokens  # tests/conftest.py: the suite's prepared tokens (vocab 300)


@pytest.fixture(scope="module")
def backbone_dir(prepared, tmp_path_factory):
    return trained_backbone(prepared, tmp_path_factory.mktemp("adapters") / "backbone")
