#!/bin/sh
# configs/llama-1b-64k.toml is the long-context config the README points to: `plan` shows it
# fitting 8 GPUs with its context parallelism, the ring's traffic both hidden behind the
# attention blocks and exposed (the last gradient hop of each layer); with parallel.cp = 1 on
# the same 8 GPUs (dp 8: each GPU a whole 64k sequence) it does not fit, and plan says so
# (exit 2) while still printing the plan.
# usage: plan_long_context.sh LLMTRAIN CONFIG CLUSTER
set -u
bin=$1 config=$2 cluster=$3
status=0
field() { echo "$1" | sed -n "s/^ *\"$2\": \\([0-9a-z.e+-]*\\),*\$/\\1/p" | head -n 1; }
check() {  # check WHAT CONDITION(awk) VALUE
    if awk -v x="$3" "BEGIN {exit !($2)}"; then echo "ok       $1: $3"; else echo "FAIL     $1: $3"; status=1; fi
}

json=$("$bin" plan "$config" --cluster "$cluster" --gpus 8 --json)
code=$?
check "plan exits 0 with the config's cp" "x == 0" "$code"
check "the config's cp" "x > 1" "$(field "$json" cp)"
check "fits" "x == \"true\"" "$(field "$json" fits)"
check "memory per GPU, GB" "x > 0 && x <= 80" "$(awk -v b="$(field "$json" total_bytes)" 'BEGIN {print b / 1e9}')"
check "ring sends hidden behind attention, s" "x > 0" "$(field "$json" cp_hidden_seconds)"
check "ring sends exposed, s" "x > 0" "$(field "$json" cp_comm_seconds)"
check "tokens/s per GPU" "x > 0" "$(field "$json" tokens_per_second_per_device)"

text=$("$bin" plan "$config" --cluster "$cluster" --gpus 8)
if echo "$text" | grep -Eq 'context-parallel ring sends \(exposed\) +[0-9.]+ ms' && echo "$text" | grep -Eq 'context-parallel ring sends \(hidden\) +[0-9.]+ ms' &&
    echo "$text" | grep -Eq 'tp 1 x cp [0-9]+ x pp 1 x dp [0-9]+'; then
    echo "ok       the text names cp and its ring sends"
else
    echo "FAIL     the text does not name cp and its ring sends:"; echo "$text"; status=1
fi

json1=$("$bin" plan "$config" --cluster "$cluster" --gpus 8 --set parallel.cp=1 --json 2>/dev/null)
code1=$?
check "plan exits 2 with cp = 1" "x == 2" "$code1"
check "cp = 1 has dp" "x == 8" "$(field "$json1" dp)"
check "cp = 1 does not fit" "x == \"false\"" "$(field "$json1" fits)"
check "cp = 1 memory per GPU, GB" "x > 80" "$(awk -v b="$(field "$json1" total_bytes)" 'BEGIN {print b / 1e9}')"
check "cp = 1 has no ring" "x == 0" "$(field "$json1" cp_comm_seconds)"
exit $status
