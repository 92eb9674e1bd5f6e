#!/usr/bin/env bash
# Launch `layerdrop pretrain` on one node of a cluster without SLURM, with torchrun.
# Run it on every node, the same command with that node's NODE_RANK; the nodes meet
# at MASTER_ADDR:MASTER_PORT (node 0's address, reachable from all of them).
#
#   one GPU:          STRATEGY=single recipes/launch/torchrun.sh recipes/271m.yaml
#   one node, 8 GPUs: recipes/launch/torchrun.sh recipes/1.8b.yaml                  (fsdp)
#   N nodes:          NNODES=4 NODE_RANK=<0..3> MASTER_ADDR=node0.cluster \
#                       recipes/launch/torchrun.sh recipes/3.9b.yaml                 (hsdp)
#
# Anything after the recipe is passed on to `layerdrop pretrain` (LightningCLI
# overrides, e.g. --trainer.max_steps 1000 --resume auto). Settings, from the
# environment (defaults in brackets):
#   NNODES [1]  NODE_RANK [0]  MASTER_ADDR [127.0.0.1]  MASTER_PORT [29500]
#   GPUS_PER_NODE [every GPU nvidia-smi lists]   ACCELERATOR [gpu]
#   STRATEGY [hsdp on several nodes: FSDP2 inside each node, replicas across; fsdp on one
#             node; or ddp, deepspeed_stage_2, deepspeed_stage_3, single]
#   PRECISION [bf16-mixed on gpu, 32-true on cpu]   PYTHON [python3]
# hsdp's shard group is the node's GPUs; another size (or FSDP2's dtypes) through the class:
#   ... torchrun.sh R.yaml --trainer.strategy framework.strategies.HSDPStrategy \
#       --trainer.strategy.shard_size 4 --trainer.strategy.param_dtype bfloat16
set -euo pipefail

if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: [NNODES=N NODE_RANK=i MASTER_ADDR=host] $0 RECIPE.yaml [pretrain overrides...]" >&2
    exit 2
fi
RECIPE=$1
shift
if [[ ! -f "$RECIPE" ]]; then
    echo "error: recipe '$RECIPE' does not exist" >&2
    exit 2
fi

NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
ACCELERATOR=${ACCELERATOR:-gpu}
if [[ -z "${STRATEGY:-}" ]]; then
    STRATEGY=$([[ "$NNODES" -gt 1 ]] && echo hsdp || echo fsdp)
fi
PYTHON=${PYTHON:-python3}
if [[ -z "${GPUS_PER_NODE:-}" ]]; then
    GPUS_PER_NODE=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
fi
if [[ "$GPUS_PER_NODE" -lt 1 ]]; then
    echo "error: no GPU found on this node; set GPUS_PER_NODE (and ACCELERATOR=cpu for a CPU run)" >&2
    exit 2
fi
if [[ -z "${PRECISION:-}" ]]; then
    PRECISION=$([[ "$ACCELERATOR" == cpu ]] && echo 32-true || echo bf16-mixed)
fi

# One process per device; Lightning reads the ranks torchrun sets (TorchElasticEnvironment).
# The trainer's devices and num_nodes must agree with what torchrun starts.
exec "$PYTHON" -m torch.distributed.run \
    --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$GPUS_PER_NODE" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    -m framework.cli pretrain --config "$RECIPE" \
    --trainer.accelerator "$ACCELERATOR" --trainer.devices "$GPUS_PER_NODE" --trainer.num_nodes "$NNODES" \
    --trainer.strategy "$STRATEGY" --trainer.precision "$PRECISION" "$@"
