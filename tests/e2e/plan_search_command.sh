#!/usr/bin/env bash
# plan_search_command.sh LLMTRAIN CONFIG CLUSTER GPUS [--set ...]: `plan --search` prints its
# winner as the `llmtrain train` command that runs it, and the --set flags of that command are
# the winner: `plan` of the same config with them (no search) passes the config checks and
# plans the winner's layout at the winner's tokens/s. Every key the search varies is among
# them, the given --set are kept, and --json lists the same flags for the winner.
set -u
bin=$1 config=$2 cluster=$3 gpus=$4
shift 4
given=("$@")
fail() { echo "FAIL: $*"; exit 1; }

search=$("$bin" plan "$config" --cluster "$cluster" --gpus "$gpus" --search "${given[@]}") || fail "plan --search exited $?"
command=$(echo "$search" | sed -n "s/^to run it ($gpus ranks): //p")
[ -n "$command" ] || fail "no 'to run it ($gpus ranks): ...' line in: $search"
winner=$(echo "$search" | sed -n 's/^why: \(.*\) is fastest: .*/\1/p')
winner_rate=$(echo "$search" | awk '/^  1 / {print $(NF - 3)}')
echo "winner: $winner, $winner_rate tokens/s per device"
echo "command: $command"

# The command as a shell reads it: llmtrain train CONFIG --set K=V ...
eval "set -- $command"
[ "$1 $2 $3" = "llmtrain train $config" ] || fail "the command does not start with 'llmtrain train $config': $command"
shift 3
flags=("$@")
for key in parallel.tp parallel.cp parallel.pp parallel.dp parallel.virtual_stages parallel.sequence_parallel parallel.zero_stage \
           train.batch_size train.global_batch_size train.grad_accum train.recompute; do
    case " ${flags[*]} " in *" $key="*) ;; *) fail "the command does not set $key" ;; esac
done
for ((i = 0; i < ${#given[@]}; i += 2)); do
    case " ${flags[*]} " in *" ${given[i + 1]%%=*}="*) ;; *) fail "the command drops the given --set ${given[i + 1]}" ;; esac
done

replanned=$("$bin" plan "$config" --cluster "$cluster" --gpus "$gpus" "${flags[@]}") || fail "plan with the printed flags exited $?"
layout=$(echo "$replanned" | sed -n "s/^layout: $gpus devices = \(.*\), [0-9]* tokens per micro-batch.*/\1/p")
rate=$(echo "$replanned" | awk '/^tokens\/s per device/ {print $NF}')
echo "plan with the flags: $layout, $rate tokens/s per device"
[ "$layout" = "$winner" ] || fail "plan with the printed flags plans '$layout'; the search's winner is '$winner'"
[ -n "$rate" ] && [ "$rate" = "$winner_rate" ] || fail "plan with the printed flags predicts $rate tokens/s per device; the search $winner_rate"

json=$("$bin" plan "$config" --cluster "$cluster" --gpus "$gpus" --search --json "${given[@]}") || fail "plan --search --json exited $?"
echo "$json" | python3 -c '
import json, sys
flags = [f for f in sys.argv[1:] if f != "--set"]
first = json.load(sys.stdin)["ranked"][0]["set"]
sys.exit(0 if first == flags else "--json lists %s for the winner; the command %s" % (first, flags))' "${flags[@]}" || fail "--json and the printed command differ"
echo "ok: the printed command's flags plan the winner, and --json lists them"
