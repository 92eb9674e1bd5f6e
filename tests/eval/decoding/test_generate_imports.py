"""`layerdrop generate` imports what decoding needs and nothing of training: no
Lightning (its import pulls Fabric, TensorBoard and dynamo: seconds before the first
token), no torch._dynamo, no torch.distributed.checkpoint (only a DCP folder needs it).
Run in a fresh interpreter, through the CLI front door, to the end of a generation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tiny_lm import export_tiny_model

REPO = Path(__file__).resolve().parents[3]
HEAVY = ("lightning", "lightning_fabric", "pytorch_lightning", "torch._dynamo", "torch.distributed.checkpoint",
         "tensorboard", "torchmetrics", "deepspeed", "lm_eval")

SCRIPT = """
import json, sys
from framework.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def generate_in_a_fresh_interpreter(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", SCRIPT, "generate", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_generate_loads_no_training_library(tmp_path):
    model = export_tiny_model(tmp_path / "model")
    result = generate_in_a_fresh_interpreter("--ckpt", str(model), "--prompt", "def main(", "--max-new-tokens", "2")
    assert result == {"code": 0, "loaded": []}
