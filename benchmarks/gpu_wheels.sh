#!/usr/bin/env bash
# Fetch, on this CPU machine, the wheels the GPU machine's image lacks (it has torch,
# lightning, torchmetrics, tokenizers, safetensors, tensorboard, numpy, ...; Python 3.12
# and no network), into .whl/ for benchmarks/gpu_check.sh. deepspeed ships as a source
# distribution only: it is built here into a pure-Python wheel (its CUDA ops are
# compiled just in time on the GPU machine, if at all: ZeRO-2 with torch's AdamW needs none).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DEST=.whl
mkdir -p "$DEST"
grep -qxF "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude

# Versions as in this project's CPU venv (constraints-cpu.txt / the Makefile).
wheels=(litdata==0.2.76 jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0
        boto3==1.44.8 botocore==1.44.8 s3transfer==0.19.3 jmespath==1.1.0
        hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5)

"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST" "${wheels[@]}"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" deepspeed==0.19.8
ls -la "$DEST"
du -sh "$DEST"
