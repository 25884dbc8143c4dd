#!/usr/bin/env bash
# memory_flat_over_steps.sh LLMTRAIN SCRATCH: a run's host memory does not grow with its steps.
# A tiny model is trained for 2,000 and for 20,000 steps, on one rank and on two (a straggler
# measurement every step: a world-sized vector per record), with log.jsonl and the metrics
# endpoint on; the peak resident set of the 20,000-step run must exceed the 2,000-step run's by
# less than 2 MB. What a run keeps per step (the step records it used to keep whole, ~0.3 KB a
# step on one rank) would add ~5 MB over the 18,000 steps between them.
set -u
bin=$1
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tiny=(configs/tiny.toml --set model.n_layers=1 --set model.d_model=16 --set model.n_heads=1 --set model.max_seq_len=16
      --set train.seq_len=16 --set train.batch_size=2 --set train.eval_every=0 --set train.sample_tokens=0 --set train.log_every=5000
      --set optimizer.warmup_steps=10 --set monitor.on_spike=\"skip\" --set metrics.straggler_interval_steps=1
      --set metrics.enabled=\"on\" --set metrics.port=0 --set metrics.listen=\"127.0.0.1\")
limit_kb=2048
failures=0

# The peak resident set in KB of the largest process the command ran (itself or, under
# mpirun, a rank): getrusage's RUSAGE_CHILDREN covers every descendant waited for. Exits 1
# with the run's last lines when the run fails.
peak_rss_kb() {  # NAME COMMAND...
    local name=$1
    shift
    python3 - "$scratch/$name.out" "$@" <<'PY'
import resource, subprocess, sys
with open(sys.argv[1], "w") as out:
    status = subprocess.run(sys.argv[2:], stdout=out, stderr=subprocess.STDOUT).returncode
if status != 0:
    sys.stderr.write(f"exit status {status}: " + "".join(open(sys.argv[1]).readlines()[-3:]))
    sys.exit(1)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
PY
}

check() {  # LABEL LAUNCHER...
    local label=$1
    shift
    local short long
    short=$(peak_rss_kb "$label-2000" "$@" "$bin" train "${tiny[@]}" --set train.steps=2000 --run-dir "$scratch/$label-2000") || { failures=$((failures + 1)); return; }
    long=$(peak_rss_kb "$label-20000" "$@" "$bin" train "${tiny[@]}" --set train.steps=20000 --run-dir "$scratch/$label-20000") || { failures=$((failures + 1)); return; }
    local grown=$((long - short))
    if [ "$grown" -ge "$limit_kb" ]; then
        echo "FAIL $label: peak RSS $short KB after 2,000 steps, $long KB after 20,000: grew $grown KB (limit $limit_kb KB)"
        failures=$((failures + 1))
    else
        echo "ok   $label: peak RSS $short KB after 2,000 steps, $long KB after 20,000: grew $grown KB (limit $limit_kb KB)"
    fi
}

check one_rank
check two_ranks mpirun --oversubscribe -np 2
[ "$failures" -eq 0 ] || { echo "$failures failed"; exit 1; }
