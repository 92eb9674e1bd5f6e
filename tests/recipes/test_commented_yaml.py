"""framework/recipes/commented_yaml.py: what it writes reads back as the same mapping, with the
comments where they were asked for."""

from __future__ import annotations

import yaml

from framework.recipes.commented_yaml import commented_yaml


def test_the_lines_read_back_as_the_mapping_with_the_comments_beside_their_keys():
    tree = {"trainer": {"devices": 8, "strategy": "fsdp"},
            "model": {"parametrization": {"eps": 1e-8, "lr": 3e-5, "tau_ema": 0.2}, "big": 2.5e6, "zero": 0.0,
                      "list": [0.1, "a"], "flag": True, "nothing": None}}
    lines = commented_yaml(tree, {"trainer.devices": "given", "model.parametrization.eps": "ε_base"})
    assert yaml.safe_load("\n".join(lines)) == tree
    assert "  devices: 8                     # given" in lines
    assert "    eps: 1.0e-08                 # ε_base" in lines
    assert sum("#" in line for line in lines) == 2
