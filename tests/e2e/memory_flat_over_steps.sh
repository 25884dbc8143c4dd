#!/usr/bin/env bash
# memory_flat_over_steps.sh LLMTRAIN SCRATCH: a run's host memory does not grow with its steps.
# A tiny model is trained for 2,000 and for 20,000 steps, on one rank and on two (a straggler
# measurement every step: a world-sized vector per record), with log.jsonl and the metrics
# endpoint on; the peak anonymous resident set of the 20,000-step run must exceed the 2,000-step
# run's by less than 2 MB. What a run keeps per step (the step records it used to keep whole, ~0.3 KB a
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

# The largest anonymous resident set in KB that any process the command ran (itself or, under
# mpirun, a rank) reached, sampled every 10 ms from /proc/PID/status. Anonymous memory (RssAnon:
# the heap, stacks, what a run keeps) is what grows with steps; the peak of the whole resident
# set (getrusage's ru_maxrss) is dominated by file-backed pages of the shared libraries, which a
# process's exit pages in by tens of MB depending on the page cache, and which made the
# comparison of two runs noisy by several MB. Exits 1 with the run's last lines when the run
# fails.
peak_anon_kb() {  # NAME COMMAND...
    local name=$1
    shift
    python3 - "$scratch/$name.out" "$@" <<'PY'
import os, subprocess, sys, time

def descendants(pid):
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return found

def anon_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0

with open(sys.argv[1], "w") as out:
    run = subprocess.Popen(sys.argv[2:], stdout=out, stderr=subprocess.STDOUT)
    peak = 0
    while run.poll() is None:
        peak = max([peak] + [anon_kb(p) for p in descendants(run.pid)])
        time.sleep(0.01)
if run.returncode != 0:
    sys.stderr.write(f"exit status {run.returncode}: " + "".join(open(sys.argv[1]).readlines()[-3:]))
    sys.exit(1)
if peak == 0:
    sys.stderr.write("no RssAnon sample of the run was read from /proc\n")
    sys.exit(1)
print(peak)
PY
}

check() {  # LABEL LAUNCHER...
    local label=$1
    shift
    local short long
    short=$(peak_anon_kb "$label-2000" "$@" "$bin" train "${tiny[@]}" --set train.steps=2000 --run-dir "$scratch/$label-2000") || { failures=$((failures + 1)); return; }
    long=$(peak_anon_kb "$label-20000" "$@" "$bin" train "${tiny[@]}" --set train.steps=20000 --run-dir "$scratch/$label-20000") || { failures=$((failures + 1)); return; }
    local grown=$((long - short))
    if [ "$grown" -ge "$limit_kb" ]; then
        echo "FAIL $label: peak anonymous RSS $short KB after 2,000 steps, $long KB after 20,000: grew $grown KB (limit $limit_kb KB)"
        failures=$((failures + 1))
    else
        echo "ok   $label: peak anonymous RSS $short KB after 2,000 steps, $long KB after 20,000: grew $grown KB (limit $limit_kb KB)"
    fi
}

check one_rank
check two_ranks mpirun --oversubscribe -np 2
[ "$failures" -eq 0 ] || { echo "$failures failed"; exit 1; }
