#!/bin/sh
# docs/planning.md's table of published training runs states `plan`'s prediction beside each;
# this runs `plan` on every row's config and cluster and fails where the page's figures
# (tokens/s per GPU and MFU) are not what the code predicts. A row's last cell is "CONFIG CLUSTER GPUS"
# (configs/CONFIG, configs/clusters/CLUSTER.toml), with " +overlaps" planned with the data-parallel
# overlaps on (parallel.overlap_param_gather, parallel.grad_reduce_dtype = "bf16", and
# parallel.tp_overlap where the config sets parallel.sequence_parallel), and " +fp8" planned
# with train.precision = "fp8" (after +overlaps when both); its "plan" cell, the fourth from
# the end, is "TOKENS_PER_S, MFU%".
# usage: plan_published_rows.sh LLMTRAIN PAGE
set -eu
bin=$1 readme=$2
rows=$(grep -E '^\|.*\| *[a-z0-9./_-]+\.toml [a-z0-9-]+ [0-9]+( \+overlaps)?( \+fp8)? *\|$' "$readme")
[ -n "$rows" ] || { echo "no published rows found in $readme"; exit 1; }
count=0 status=0
echo "$rows" | { while IFS= read -r row; do
    last=$(echo "$row" | awk -F'|' '{print $(NF-1)}')
    predicted=$(echo "$row" | awk -F'|' '{print $(NF-4)}' | tr -d ' ')
    set -- $last
    config=configs/$1 cluster=configs/clusters/$2.toml gpus=$3 overlaps= fp8=
    for word in ${4:-} ${5:-}; do case $word in +overlaps) overlaps=$word ;; +fp8) fp8=$word ;; esac; done
    nodes=$(( (gpus + 7) / 8 ))
    set --
    [ "$overlaps" = "+overlaps" ] && set -- --set parallel.overlap_param_gather=true --set parallel.grad_reduce_dtype='"bf16"'
    [ "$overlaps" = "+overlaps" ] && grep -q '^sequence_parallel = true' "$config" && set -- "$@" --set parallel.tp_overlap=true
    [ "$fp8" = "+fp8" ] && set -- "$@" --set train.precision='"fp8"'
    json=$("$bin" plan "$config" --cluster "$cluster" --gpus "$gpus" --nodes "$nodes" "$@" --json < /dev/null)
    tokens=$(echo "$json" | sed -n 's/^ *"tokens_per_second_per_device": \([0-9.e+-]*\),*$/\1/p')
    mfu=$(echo "$json" | sed -n 's/^ *"mfu": \([0-9.e+-]*\),*$/\1/p')
    actual=$(awk -v t="$tokens" -v m="$mfu" 'BEGIN {printf "%.0f,%.1f%%", t, 100 * m}')
    if [ "$actual" = "$predicted" ]; then echo "ok       $config on $gpus x $cluster $overlaps $fp8: $actual"
    else echo "MISMATCH $config on $gpus x $cluster $overlaps $fp8: the page says $predicted, plan predicts $actual"; status=1; fi
    count=$((count + 1))
done; echo "$count rows"; exit $status; }
