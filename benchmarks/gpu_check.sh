#!/usr/bin/env bash
# The one-shot GPU check: on one H200, the 271M recipe in bf16-mixed, each run a real
# `layerdrop pretrain` (benchmarks/gpu_throughput.py times it), writing tokens/s, MFU
# from executed FLOPs (dense peak 989.5 TFLOP/s) and these comparisons to JSON:
#
#   fsdp-fp32-dense vs fsdp-bf16-dense   FSDP2 with float32 vs bfloat16 all-gathers
#                                        (MixedPrecisionPolicy; on one GPU the "all-gather"
#                                        is a local copy, so this measures the cast-once
#                                        policy against autocast's cast-per-matmul, not
#                                        network bytes: BENCHMARKS.md has those)
#   fsdp-bf16-dense vs fsdp-bf16-ild-dts dense vs ILD+DTS (p_max 0.4): realised step-time
#   deepspeed2-dense vs deepspeed2-ild-dts   saving against the executed-FLOPs saving
#   fsdp-bf16-ild-dts vs ...-compile     torch.compile of every block on vs off, and the
#                                        graphs torch._dynamo makes over the run while the
#                                        kept-row counts and r_train change every step
#                                        (bound: 2 graphs per block, no recompile limit hit)
#   decode                               greedy decoding tokens/s of the 504M shape (random bf16
#                                        weights), batch 1 and 8, the full model and exit L/3,
#                                        eager and compiled, static shapes (CUDA graphs) and dynamic
#                                        (benchmarks/gpu_decoding.py --compile -> decoding.json,
#                                        rewritten after each row; ~3-5 min, most of it compiling)
#
# Budget: the device lends 15 minutes per session, start included, and 10 per command.
# DEADLINE=S (seconds since the script began) skips a run that could not finish before it,
# and shortens the core subset's sweep to fit; CORE_JOBS / CORE_THREADS set its parallelism.
# STEPS=60 (10 of warmup left out of the means; the compile run's 60 steps give its
# graph count over 50 steps after its first); each eager run ~1 minute, the compile run
# ~2-3 (estimates, not measured). RUNS="name ..." runs a subset, in the order given.
#
# Before the device call, here on the CPU machine (once):
#   bash benchmarks/gpu_wheels.sh          # .whl/: deepspeed, litdata, jsonargparse, ... for Python 3.12
#   bash benchmarks/gpu_check.sh --prepare # benchmarks/out/gpu-data: ~3 M tokens of the builtin corpus
# Then one device call, carrying both:
#   run(command="bash benchmarks/gpu_check.sh", carry=[".whl", "benchmarks/out/gpu-data"], timeout_s=600)
# The JSON files come back under $OUT; copy gpu_check.json to benchmarks/results/ and
# the table into BENCHMARKS.md with the date and the machine.
#
# RUNS=paper-gpu-core is the reproduction's core at the paper's 20 tokens per parameter
# (recipes/sweeps/paper-gpu.yaml: dense x 2, ILD+DTS p_max 0.4 x 2, ILD+ITS 0.8, ILD+DTS 0.8 with
# r_train = 1; 3,892 steps each, three at a time, held-out and skip evaluations; the data is
# prepared there, ~1 minute), in its own device call:
#   run(command="RUNS=paper-gpu-core bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=600)
# It returns paper-gpu-core.tar.gz (the report folder: README, report.json, every run's small
# files, so `layerdrop sweep recipes/sweeps/paper-gpu.yaml --done-from DIR` adopts them) and
# paper-gpu-core.log. With SMOKE=1 it is a --dry-run of the same six runs on the CPU.
# RUNS=paper-gpu-lambda (issue 43 item 7), in a device call of its own after the core's: the λ bracket
# at 20 TPP of the core's P̄ 20% rows, ILD+ITS 0.8 and ILD+DTS 0.8 with r_train = 1 at τ_EMA 0.26 and
# 0.78 (seed 0; the core has both at 0.45), four at once (CORE_JOBS=4 unless set: ~8 minutes if
# four run at the two-at-a-time ~10 steps/s, not measured). paper-gpu-lambda.tar.gz's report puts
# each configuration at its own τ_EMA beside the same-λ comparison once the core's runs are adopted
# with --done-from (docs/lambda-6tpp/PROTOCOL.md's rules: 2 seeds at the best point and its
# neighbours close a bracket, so this subset opens the brackets, and the recipe's second seeds
# close them in a full sweep).
#
# Without a GPU, SMOKE=1 runs the same sequence on the CPU with recipes/tiny.yaml, 12
# steps and 32-true precision (no DeepSpeed: Lightning's is CUDA-only), to
# check the script end to end; its numbers mean nothing:
#   SMOKE=1 GPU_DATA=<a `layerdrop prepare` folder> PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh
#
# What is measured: FSDP2 is our FSDP2Strategy on one device (world size 1), ZeRO-2
# likewise; the 271M recipe's micro-batch (7 x 2048 tokens) and optimizer are kept;
# data is the builtin corpus with an 8192-token BPE (no Llama-3 tokenizer on these
# machines), which changes no FLOP: the model keeps its 128,256-row embedding and head.
set -uo pipefail
cd "$(dirname "$0")/.."

DATA=${GPU_DATA:-benchmarks/out/gpu-data}
RESULTS=${OUT:-benchmarks/out/gpu-check}  # what comes back: at most 8 files
OUT_DIR=/tmp/gpu-check-out
PYTHON=${PYTHON:-python3}
if [[ "${SMOKE:-0}" == 1 ]]; then
    RECIPE=recipes/tiny.yaml ACCELERATOR=cpu PRECISION=32-true WORKERS=0
    STEPS=${STEPS:-12} WARMUP=${WARMUP:-2} RUN_TIMEOUT=${RUN_TIMEOUT:-600}
    SMOKE_ARGS=(--model.lr_schedule.warmup_steps 1)  # the recipe's 20 would outlast the run
    DEFAULT_RUNS="fsdp-fp32-dense fsdp-bf16-dense fsdp-bf16-ild-dts fsdp-bf16-ild-dts-compile decode"
    DECODE=(--shape tiny --device cpu --dtype float32 --new-tokens 8 --repeats 1)
else
    RECIPE=recipes/271m.yaml ACCELERATOR=gpu PRECISION=bf16-mixed WORKERS=4
    STEPS=${STEPS:-60} WARMUP=${WARMUP:-10} RUN_TIMEOUT=${RUN_TIMEOUT:-150}
    SMOKE_ARGS=()
    DEFAULT_RUNS="fsdp-fp32-dense fsdp-bf16-dense fsdp-bf16-ild-dts fsdp-bf16-ild-dts-compile deepspeed2-dense deepspeed2-ild-dts decode"
    DECODE=(--shape 504M --device cuda --dtype bfloat16 --compile)
fi
RUNS=${RUNS:-$DEFAULT_RUNS}
KNOWN_RUNS=(fsdp-fp32-dense fsdp-bf16-dense fsdp-bf16-ild-dts fsdp-bf16-ild-dts-compile deepspeed2-dense
            deepspeed2-ild-dts decode paper-gpu-core paper-gpu-lambda)
for name in $RUNS; do  # a misspelt name is refused before the wheels, the data or any run, not after them
    [[ " ${KNOWN_RUNS[*]} " == *" $name "* ]] \
        || { echo "error: unknown run '$name' in RUNS (known: ${KNOWN_RUNS[*]})" >&2; exit 2; }
done

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
rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR" "$RESULTS"
if [[ "$ACCELERATOR" == gpu ]]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT_DIR/machine.txt"
else
    echo "SMOKE: CPU ($(nproc --all) cores), recipe $RECIPE, $STEPS steps" | tee "$OUT_DIR/machine.txt"
fi
"$PYTHON" -c "import torch, lightning, litdata; print('torch', torch.__version__, 'lightning', lightning.__version__)" \
    | tee -a "$OUT_DIR/machine.txt" || { echo "error: a dependency is missing (see above)" >&2; exit 1; }
CORE_RUNS=("dense,seed=0" "dense,seed=1" "ild-dts-0.4,seed=0" "ild-dts-0.4,seed=1" "ild-its-0.8,seed=0"
           "ild-dts-0.8-r1,seed=0")
# the P̄ 20% rows of the core at the √3 neighbours of its τ_EMA 0.45: their λ bracket at 20 TPP
LAMBDA_RUNS=("ild-its-0.8-tau-0.26,seed=0" "ild-its-0.8-tau-0.78,seed=0" "ild-dts-0.8-r1-tau-0.26,seed=0"
             "ild-dts-0.8-r1-tau-0.78,seed=0")
CORE_TIMEOUT=${CORE_TIMEOUT:-540}
CORE_THREADS=${CORE_THREADS:-4}  # CORE_JOBS: the core's 3, the λ subset's 4 (all at once) unless set
DEADLINE=${DEADLINE:-0}  # 0: none
throughput_runs=${RUNS//paper-gpu-core/}
throughput_runs=${throughput_runs//paper-gpu-lambda/}
throughput_runs=${throughput_runs//decode/}
[[ -z "${throughput_runs// /}" || -d "$DATA" ]] || prepare_data || exit 1

fsdp2() {  # FSDP2Strategy on one device, all-gathers in $1
    echo "{\"class_path\": \"framework.strategies.FSDP2Strategy\", \"init_args\": {\"param_dtype\": \"$1\"}}"
}
common=(--config "$RECIPE" --trainer.accelerator "$ACCELERATOR" --trainer.devices 1 --trainer.num_nodes 1
        --trainer.precision "$PRECISION" --trainer.max_steps "$STEPS" --trainer.limit_val_batches 0
        --trainer.enable_progress_bar false --trainer.logger false --checkpoint.every_n_steps 100000
        --data.data_dir "$DATA" --data.num_workers "$WORKERS" --throughput.peak_flops_per_device 989.5e12
        "${SMOKE_ARGS[@]}")
dense=(--model.layer_dropout.p_max 0.0)
ild_dts=(--model.layer_dropout.p_max 0.4 --model.layer_dropout.distribution increasing
         --model.layer_dropout.schedule decreasing)

fits() {  # seconds: would a step of that length still end before DEADLINE?
    [[ "$DEADLINE" -eq 0 || $((SECONDS + $1)) -le "$DEADLINE" ]]
}

run_one() {  # name, strategy, pretrain args...
    local name=$1 strategy=$2
    shift 2
    fits "$RUN_TIMEOUT" || { echo "=== $name skipped: ${RUN_TIMEOUT} s would pass DEADLINE ($SECONDS of $DEADLINE s gone)"; return; }
    echo "=== $name"
    timeout "$RUN_TIMEOUT" "$PYTHON" benchmarks/gpu_throughput.py --name "$name" --out "$OUT_DIR" --warmup "$WARMUP" -- \
        "${common[@]}" --trainer.strategy "$strategy" --trainer.default_root_dir "/tmp/gpu-check/$name" "$@" \
        > "$OUT_DIR/$name.log" 2>&1
    local code=$?
    tail -n 25 "$OUT_DIR/$name.log"
    [[ $code -eq 0 ]] || echo "=== $name FAILED (exit $code)"
}

decode() {  # decoding tokens/s (benchmarks/gpu_decoding.py), its JSON straight into what comes back
    fits 300 || { echo "=== decode skipped: 300 s would pass DEADLINE ($SECONDS of $DEADLINE s gone)"; return; }
    echo "=== decode"
    timeout 420 "$PYTHON" benchmarks/gpu_decoding.py "${DECODE[@]}" --out "$RESULTS" > "$OUT_DIR/decode.log" 2>&1
    local code=$?
    tail -n 8 "$OUT_DIR/decode.log"
    [[ $code -eq 0 ]] || echo "=== decode FAILED (exit $code)"
}

paper_gpu_subset() {  # name, runs...: a subset of recipes/sweeps/paper-gpu.yaml in one call, then its report
    local name=$1; shift
    local sweep=/tmp/gpu-check/$name file="$OUT_DIR/$name.yaml" runs=("$@")
    # paper-gpu.yaml without the draft search (minutes per run on its own): same runs, same recipes
    "$PYTHON" -c "import sys, yaml; s = yaml.safe_load(open(sys.argv[1])); \
s['evals'] = [e for e in s['evals'] if e['command'] != 'speculate search']; \
yaml.safe_dump(s, open(sys.argv[2], 'w'), sort_keys=False)" recipes/sweeps/paper-gpu.yaml "$file" || return 1
    echo "=== $name"
    if [[ "${SMOKE:-0}" == 1 ]]; then
        "$PYTHON" -m framework.cli sweep "$file" --out "$sweep" --only "${runs[@]}" --dry-run \
            2>&1 | tee "$RESULTS/$name.log"
        return "${PIPESTATUS[0]}"
    fi
    local limit=$CORE_TIMEOUT jobs=${CORE_JOBS:-${#runs[@]}}
    (( jobs <= ${#runs[@]} )) || jobs=${#runs[@]}
    # the report and the archive after it take well under a minute
    [[ "$DEADLINE" -eq 0 ]] || limit=$(( DEADLINE - SECONDS - 45 < CORE_TIMEOUT ? DEADLINE - SECONDS - 45 : CORE_TIMEOUT ))
    [[ $limit -gt 60 ]] || { echo "=== $name skipped: ${limit} s left before DEADLINE"; return 1; }
    echo "$name: sweep limit ${limit} s, ${jobs} jobs of ${CORE_THREADS} threads" >> "$OUT_DIR/machine.txt"
    timeout "$limit" "$PYTHON" -m framework.cli sweep "$file" --out "$sweep" --only "${runs[@]}" \
        --jobs "$jobs" --threads-per-job "$CORE_THREADS" > "$OUT_DIR/$name.log" 2>&1
    local code=$?
    tail -n 25 "$OUT_DIR/$name.log"
    [[ $code -eq 0 ]] || echo "=== $name: the sweep stopped (exit $code); reporting what finished"
    "$PYTHON" -m framework.cli report "$sweep" --out "/tmp/gpu-check/$name-report" --overwrite \
        >> "$OUT_DIR/$name.log" 2>&1
    tar -czf "$RESULTS/$name.tar.gz" -C /tmp/gpu-check "$name-report"
    cp "$OUT_DIR/$name.log" "$RESULTS/"
}

for name in $RUNS; do
    case $name in
        paper-gpu-core)            CORE_JOBS=${CORE_JOBS:-3} paper_gpu_subset "$name" "${CORE_RUNS[@]}" ;;
        paper-gpu-lambda)          paper_gpu_subset "$name" "${LAMBDA_RUNS[@]}" ;;
        decode)                    decode ;;
        fsdp-fp32-dense)           run_one "$name" "$(fsdp2 float32)" "${dense[@]}" ;;
        fsdp-bf16-dense)           run_one "$name" "$(fsdp2 bfloat16)" "${dense[@]}" ;;
        fsdp-bf16-ild-dts)         run_one "$name" "$(fsdp2 bfloat16)" "${ild_dts[@]}" ;;
        fsdp-bf16-ild-dts-compile) RUN_TIMEOUT=$((RUN_TIMEOUT * 2)) run_one "$name" "$(fsdp2 bfloat16)" \
                                       "${ild_dts[@]}" --model.compile true ;;
        deepspeed2-dense)          run_one "$name" deepspeed_stage_2 "${dense[@]}" ;;
        deepspeed2-ild-dts)        run_one "$name" deepspeed_stage_2 "${ild_dts[@]}" ;;
    esac
done

shopt -s nullglob
results=("$OUT_DIR"/*.json)
[[ ${#results[@]} -gt 0 ]] && "$PYTHON" benchmarks/gpu_throughput.py --summarize "${results[@]}" --out "$RESULTS" \
    | tee "$RESULTS/table.md"
cp "$OUT_DIR/machine.txt" "$RESULTS/"
# the subsets' logs go back whole beside their archives, not into the throughput runs' logs
for log in "$OUT_DIR"/*.log; do
    [[ "$log" == */paper-gpu-core.log || "$log" == */paper-gpu-lambda.log ]] || { echo "=== $log"; tail -c 200000 "$log"; }
done > "$RESULTS/logs.txt"
