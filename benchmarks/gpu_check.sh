#!/usr/bin/env bash
# The one-shot GPU check (issue 5): on one H200, the 271M recipe in bf16 for 100 steps
# with FSDP2 and with DeepSpeed ZeRO-2, dense and ILD+DTS (p_max 0.4, the recipe's),
# writing tokens/s, MFU from executed FLOPs (dense peak 989.5 TFLOP/s) and the
# step-time saving to JSON. Budget: the device lends 15 minutes per session, start
# included; the four runs take ~1-2 minutes each on an H200 (estimate, not measured).
#
# Before the device call, here on the CPU machine (once):
#   bash benchmarks/gpu_wheels.sh          # .whl/: deepspeed, litdata, jsonargparse, ... for Python 3.12
#   bash benchmarks/gpu_check.sh --prepare # benchmarks/out/gpu-data: ~3 M tokens of the builtin corpus
# Then one device call, carrying both:
#   run(command="bash benchmarks/gpu_check.sh", carry=[".whl", "benchmarks/out/gpu-data"], timeout_s=600)
# The JSON files come back under $OUT; copy gpu_check.json to benchmarks/results/ and
# the table into BENCHMARKS.md with the date and the machine.
#
# What is measured: FSDP2 here is ModelParallelStrategy with data_parallel_size=1 (one
# GPU, so fully_shard's collectives are no-ops: the overhead of the FSDP2 code path,
# not multi-GPU scaling); ZeRO-2 likewise on one GPU. The 271M recipe's micro-batch
# (7 x 2048 tokens) and optimizer are kept; data is the builtin corpus with an
# 8192-token BPE (no Llama-3 tokenizer on these machines), which changes no FLOP: the
# model keeps its 128,256-row embedding and unembedding.
set -uo pipefail
cd "$(dirname "$0")/.."

DATA=${GPU_DATA:-benchmarks/out/gpu-data}
RESULTS=${OUT:-benchmarks/out/gpu-check}  # what comes back: at most 8 files
OUT_DIR=/tmp/gpu-check-out
STEPS=${STEPS:-100}
WARMUP=${WARMUP:-10}
RUN_TIMEOUT=${RUN_TIMEOUT:-150}
PYTHON=${PYTHON:-python3}

prepare_data() {
    "$PYTHON" -m framework.cli prepare --corpus builtin --tokenizer train --vocab-size 8192 \
        --max-tokens 3M --val-fraction 0.01 --no-progress --out "$DATA"
}

if [[ "${1:-}" == "--prepare" ]]; then
    PYTHON=${PYTHON_PREPARE:-.venv/bin/python}
    [[ -d "$DATA" ]] && { echo "$DATA already exists"; exit 0; }
    prepare_data
    exit $?
fi

if [[ -d .whl ]]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "error: installing the carried wheels failed" >&2; exit 1; }
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT_DIR" "$RESULTS"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT_DIR/machine.txt"
"$PYTHON" -c "import torch, lightning, deepspeed, litdata; print('torch', torch.__version__, 'lightning', lightning.__version__, 'deepspeed', deepspeed.__version__)" \
    | tee -a "$OUT_DIR/machine.txt" || { echo "error: a dependency is missing (see above)" >&2; exit 1; }
[[ -d "$DATA" ]] || prepare_data || exit 1

FSDP2_ONE_GPU='{"class_path": "lightning.pytorch.strategies.ModelParallelStrategy", "init_args": {"data_parallel_size": 1, "tensor_parallel_size": 1}}'
common=(--config recipes/271m.yaml --trainer.devices 1 --trainer.num_nodes 1 --trainer.precision bf16-mixed
        --trainer.max_steps "$STEPS" --trainer.limit_val_batches 0 --trainer.enable_progress_bar false
        --trainer.logger false --checkpoint.every_n_steps 100000 --data.data_dir "$DATA" --data.num_workers 4
        --throughput.peak_flops_per_device 989.5e12)
dense=(--model.layer_dropout.p_max 0.0)
ild_dts=(--model.layer_dropout.p_max 0.4 --model.layer_dropout.distribution increasing
         --model.layer_dropout.schedule decreasing)

run_one() {  # name, strategy, dropout args...
    local name=$1 strategy=$2
    shift 2
    echo "=== $name"
    timeout "$RUN_TIMEOUT" "$PYTHON" benchmarks/gpu_throughput.py --name "$name" --out "$OUT_DIR" --warmup "$WARMUP" -- \
        "${common[@]}" --trainer.strategy "$strategy" --trainer.default_root_dir "/tmp/gpu-check/$name" "$@" \
        > "$OUT_DIR/$name.log" 2>&1
    local code=$?
    tail -n 25 "$OUT_DIR/$name.log"
    [[ $code -eq 0 ]] || echo "=== $name FAILED (exit $code)"
}

run_one fsdp-dense "$FSDP2_ONE_GPU" "${dense[@]}"
run_one fsdp-ild-dts "$FSDP2_ONE_GPU" "${ild_dts[@]}"
run_one deepspeed2-dense deepspeed_stage_2 "${dense[@]}"
run_one deepspeed2-ild-dts deepspeed_stage_2 "${ild_dts[@]}"

shopt -s nullglob
results=("$OUT_DIR"/fsdp-*.json "$OUT_DIR"/deepspeed2-*.json)
[[ ${#results[@]} -gt 0 ]] && "$PYTHON" benchmarks/gpu_throughput.py --summarize "${results[@]}" --out "$RESULTS" \
    | tee "$RESULTS/table.md"
cp "$OUT_DIR/machine.txt" "$RESULTS/"
for log in "$OUT_DIR"/*.log; do echo "=== $log"; tail -c 200000 "$log"; done > "$RESULTS/logs.txt"
