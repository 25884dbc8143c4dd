#!/usr/bin/env bash
# slurm-targets.sh [JOB_ID] [RANKS_PER_NODE] [PORT]: the Prometheus file_sd targets of an
# llmtrain job under Slurm: every node of the allocation, ports PORT .. PORT + RANKS_PER_NODE - 1
# (metrics.port + node-local rank). Defaults: $SLURM_JOB_ID, $SLURM_NTASKS_PER_NODE (else 1),
# 9480. Writes JSON to stdout:
#   scripts/prometheus/slurm-targets.sh 123456 8 > scripts/prometheus/targets/123456.json
set -euo pipefail
job=${1:-${SLURM_JOB_ID:?give a Slurm job id}}
per_node=${2:-${SLURM_NTASKS_PER_NODE:-1}}
port=${3:-9480}
if [ -n "${SLURM_JOB_NODELIST:-}" ] && [ "$job" = "${SLURM_JOB_ID:-}" ]; then
    nodelist=$SLURM_JOB_NODELIST
else
    nodelist=$(squeue -h -j "$job" -o %N)
fi
targets=()
for node in $(scontrol show hostnames "$nodelist"); do
    for ((r = 0; r < per_node; r++)); do targets+=("\"$node:$((port + r))\""); done
done
joined=$(IFS=,; echo "${targets[*]}")
printf '[{"targets": [%s], "labels": {"slurm_job_id": "%s"}}]\n' "$joined" "$job"
