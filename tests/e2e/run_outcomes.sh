#!/usr/bin/env bash
# run_outcomes.sh LLMTRAIN SCRATCH: a finished run, runs stopped by SIGINT, SIGTERM and
# SIGUSR1, a run killed by SIGKILL, a crashed run, a failed run and a diverged run are told
# apart by their run directory alone (the last record of log.jsonl), and each ends with the
# exit code of README's table.
set -u
bin=$1
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch"
tiny=(configs/tiny.toml --set model.n_layers=1 --set model.d_model=32 --set train.batch_size=2 --set train.seq_len=16
      --set train.eval_sequences=2 --set train.sample_tokens=0 --set train.threads=1 --set optimizer.warmup_steps=1)
failures=0

# The "event" of the last record of DIR/log.jsonl.
last_event() { tail -n 1 "$1/log.jsonl" | grep -o '"event":"[a-z]*"' | cut -d'"' -f4; }

check() {  # NAME STATUS WANT_STATUS WANT_LAST_EVENT [REGEX the last record matches]
    local name=$1 status=$2 want_status=$3 want_event=$4 regex=${5:-.}
    local dir=$scratch/$name event
    event=$(last_event "$dir")
    if [ "$status" -ne "$want_status" ] || [ "$event" != "$want_event" ] || ! tail -n 1 "$dir/log.jsonl" | grep -Eq -- "$regex"; then
        echo "FAIL $name: exit $status (want $want_status), last record: $(tail -n 1 "$dir/log.jsonl")"
        echo "  want event '$want_event' matching /$regex/"
        failures=$((failures + 1))
    else
        echo "ok   $name: exit $status, last record $event"
    fi
}

run_to_end() {  # NAME STEPS [ENV=VALUE ...]: the exit status
    local name=$1 steps=$2
    shift 2
    env "$@" "$bin" train "${tiny[@]}" --set train.steps="$steps" --run-dir "$scratch/$name" >"$scratch/$name.out" 2>&1
}

# Starts a long run, waits for its first step record, sends SIGNAL, returns the exit status.
run_and_signal() {  # NAME SIGNAL
    local name=$1 signal=$2 pid
    "$bin" train "${tiny[@]}" --set train.steps=1000000 --run-dir "$scratch/$name" >"$scratch/$name.out" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        grep -q '"event":"step"' "$scratch/$name/log.jsonl" 2>/dev/null && break
        sleep 0.1
    done
    kill -s "$signal" "$pid"
    wait "$pid"
}

run_to_end finished 3; check finished $? 0 end '"exit_code":0'
grep -q '^done: 3 steps' "$scratch/finished/console.log" || { echo "FAIL finished: console.log lacks the summary"; failures=$((failures + 1)); }

run_and_signal sigint INT; check sigint $? 130 interrupted '"signal":"SIGINT"'
run_and_signal sigterm TERM; check sigterm $? 75 interrupted '"signal":"SIGTERM"'
run_and_signal sigusr1 USR1; check sigusr1 $? 75 interrupted '"signal":"SIGUSR1"'
run_and_signal sigkill KILL; check sigkill $? 137 step

run_to_end crashed 5 LLMTRAIN_INJECT_FAULT=abort:0:2; check crashed $? 134 crash '"signal":"SIGABRT"'
run_to_end hardware 5 LLMTRAIN_INJECT_FAULT=hardware:0:2; check hardware $? 76 error '"kind":"hardware fault"'
grep -q '^llmtrain: hardware fault: ' "$scratch/hardware/console.log" || { echo "FAIL hardware: console.log lacks the error line"; failures=$((failures + 1)); }
run_to_end diverged 5 LLMTRAIN_INJECT_FAULT=nan:0:2; check diverged $? 3 error '"kind":"training diverged"'

# A run directory that cannot be made: a runtime (I/O) failure, exit 1.
"$bin" train "${tiny[@]}" --set train.steps=2 --run-dir /dev/null/run >"$scratch/io.out" 2>&1
status=$?
if [ "$status" -ne 1 ] || ! grep -q "^llmtrain: I/O error: cannot create run directory '/dev/null/run'" "$scratch/io.out"; then
    echo "FAIL io: exit $status (want 1)"; cat "$scratch/io.out"; failures=$((failures + 1))
else
    echo "ok   io: exit 1"
fi

if [ "$failures" -ne 0 ]; then echo "$failures outcome(s) wrong"; exit 1; fi
echo "every outcome is told apart by its run directory and exit code"
