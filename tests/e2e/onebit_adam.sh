#!/usr/bin/env bash
# onebit_adam.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: the same run on dp 2 with AdamW
# and with 1-bit Adam (optimizer.freeze_step = 100). 1-bit Adam's final validation loss must be
# within 3% of AdamW's, and the bytes each rank sent over dp per step after the freeze (its
# own dp_bytes_sent counter in log.jsonl) at least 10x fewer than AdamW's f32 all-reduce.
set -u
scratch=$1 bin=$2 mpiexec=$3
shift 3
rm -rf "$scratch"
mkdir -p "$scratch"
freeze=100
common=("$@" --set parallel.zero_stage=0 --set train.sample_tokens=0 --set train.log_every=100)
for optimizer in adamw onebit_adam; do
    "$mpiexec" --oversubscribe -np 2 "$bin" train "${common[@]}" --set optimizer.name=\"$optimizer\" --set optimizer.freeze_step=$freeze \
        --run-dir "$scratch/$optimizer" >"$scratch/$optimizer.out" 2>&1 || { echo "FAIL: the $optimizer run failed"; tail -5 "$scratch/$optimizer.out"; exit 1; }
done
final_val() { grep '"event":"eval"' "$1/log.jsonl" | tail -1 | sed -E 's/.*"val_loss":([^,}]*).*/\1/'; }
# The mean dp_bytes_sent of the steps after `after`.
bytes_after() { grep '"event":"step"' "$1/log.jsonl" | sed -E 's/.*"dp_bytes_sent":([0-9]+).*"step":([0-9]+),.*/\2 \1/' |
    awk -v after="$2" '$1 > after { s += $2; n++ } END { if (n) printf "%.0f", s / n; else print 0 }'; }
adamw=$(final_val "$scratch/adamw") onebit=$(final_val "$scratch/onebit_adam")
adamw_bytes=$(bytes_after "$scratch/adamw" $freeze) onebit_bytes=$(bytes_after "$scratch/onebit_adam" $freeze)
echo "final val loss: adamw $adamw, onebit_adam $onebit; dp bytes per step after step $freeze: adamw $adamw_bytes, onebit_adam $onebit_bytes"
awk -v a="$adamw" -v o="$onebit" 'BEGIN { exit !(a > 0 && o > 0 && o <= a * 1.03) }' ||
    { echo "FAIL: 1-bit Adam's validation loss is not within 3% of AdamW's"; exit 1; }
awk -v a="$adamw_bytes" -v o="$onebit_bytes" 'BEGIN { exit !(o > 0 && a >= 10 * o) }' ||
    { echo "FAIL: 1-bit Adam did not send at least 10x fewer bytes per step than AdamW"; exit 1; }
awk -v a="$adamw_bytes" -v o="$onebit_bytes" 'BEGIN { printf "ok: within 3%%, %.1fx fewer bytes per step\n", a / o }'
