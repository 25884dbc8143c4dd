#!/bin/sh
# `plan` prints the goodput of a config with persistent checkpoints only and with node-local
# snapshots too, and the node-local snapshots' bytes per node; with the snapshots more often
# than the persistent checkpoints, goodput is higher. The node MTBF comes from --mtbf-hours or
# from the cluster file's node.mtbf_hours, with the same figures.
# usage: plan_goodput.sh LLMTRAIN CONFIG CLUSTER SCRATCH_DIR MTBF_HOURS LOCAL_EVERY_STEPS
set -u
bin=$1 config=$2 cluster=$3 scratch=$4 mtbf=$5 local_every=$6
status=0
ok() { echo "ok       $1"; }
bad() { echo "FAIL     $1"; status=1; }
check() {  # check WHAT CONDITION(awk, on x and y) X [Y]
    if awk -v x="$3" -v y="${4:-}" "BEGIN {exit !($2)}"; then ok "$1: $3 ${4:-}"; else bad "$1: $3 ${4:-}"; fi
}
# The goodput (%) printed on the row whose label starts with $2.
goodput_of() { echo "$1" | sed -n "s/^ *$2 .*every [0-9]* steps* ([^)]*): \\([0-9.]*\\)%.*/\\1/p" | head -n 1; }

text=$("$bin" plan "$config" --cluster "$cluster" --mtbf-hours "$mtbf" --set checkpoint.local.every_steps="$local_every" < /dev/null)
code=$?
check "plan exits 0" "x == 0" "$code"
echo "$text" | sed -n '/^node-local snapshots/,/replica traffic/p;/^goodput/,$p'

without=$(goodput_of "$text" "persistent checkpoints only")
with=$(goodput_of "$text" "with local snapshots")
check "goodput with persistent checkpoints only, %" "x > 0 && x <= 100" "$without"
check "goodput with local snapshots every $local_every steps, %" "x > 0 && x <= 100" "$with"
check "with local snapshots above without" "x > y" "$with" "$without"
check "goodput at the best checkpoint interval, %" "x >= y" "$(goodput_of "$text" " *at the best checkpoint interval")" "$without"
check "goodput at the best snapshot interval, %" "x >= y" "$(goodput_of "$text" " *at the best snapshot interval")" "$with"
if echo "$text" | grep -Eq "^  node MTBF +$mtbf h \\(--mtbf-hours\\); [0-9]+ nodes: job MTBF [0-9.]+ h" &&
    echo "$text" | grep -Eq "Young/Daly sqrt\\(2 x [0-9.e-]+ s x [0-9.]+ h\\) = " &&
    echo "$text" | grep -Eq "^  one snapshot of the node's own ranks +[0-9.]+ GB \\([0-9]+ x [0-9.]+ GB\\)" &&
    echo "$text" | grep -Eq "^  peak: [0-9]+ while the next is written +[0-9.]+ GB" &&
    echo "$text" | grep -Eq "^  total at the peak +[0-9.]+ GB" &&
    echo "$text" | grep -Eq "^  replica traffic per snapshot +[0-9.]+ GB out of each node"; then
    ok "the MTBF, the Young/Daly interval and the node-local bytes are printed"
else
    bad "the MTBF, the Young/Daly interval or the node-local bytes are missing"
fi

# The same node MTBF from the cluster file: the same figures.
mkdir -p "$scratch"
from_file="$scratch/cluster_with_mtbf.toml"
sed "s/^\\[node\\]\$/[node]\\nmtbf_hours = $mtbf/" "$cluster" > "$from_file"
text2=$("$bin" plan "$config" --cluster "$from_file" --set checkpoint.local.every_steps="$local_every" < /dev/null)
code2=$?
check "plan exits 0 with node.mtbf_hours in the cluster file" "x == 0" "$code2"
echo "$text2" | grep -q "(node.mtbf_hours)" && ok "the MTBF is named as the cluster file's" || bad "the MTBF is not named as the cluster file's"
check "the same goodput from node.mtbf_hours" "x == y" "$(goodput_of "$text2" "with local snapshots")" "$with"
exit $status
