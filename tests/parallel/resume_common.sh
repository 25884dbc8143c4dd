# Sourced by the resume tests (resume_on_other_layouts.sh, resume_across_zero_stages.sh), whose
# arguments are SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: a fresh scratch directory, the
# ten-step run every resume belongs to, and the check that a resumed run's steps 6..10 are an
# uninterrupted run's within 1e-5 relative.
set -u
scratch=$1 bin=$2 mpiexec=$3
shift 3
rm -rf "$scratch"
mkdir -p "$scratch"
common=("$@" --set train.steps=10 --set train.batch_size=2 --set train.global_batch_size=8 --set train.sample_tokens=0 --set train.log_every=100)
failures=0

run() {  # NAME RANKS [--set ...]
    local name=$1 ranks=$2
    shift 2
    local launch=("$bin")
    [ "$ranks" -gt 1 ] && launch=("$mpiexec" --oversubscribe -np "$ranks" "$bin")
    "${launch[@]}" train "${common[@]}" "$@" --run-dir "$scratch/$name" >"$scratch/$name.out" 2>&1 ||
        { echo "FAIL: run $name failed:"; tail -5 "$scratch/$name.out"; exit 1; }
}

# step loss, for steps 6..10
losses() { grep '"event":"step"' "$1/log.jsonl" | sed -E 's/.*"loss":([^,]*).*"step":([0-9]+),.*/\2 \1/' | awk '$1 > 5' | sort -n; }

# The uninterrupted single-process run the resumes are compared with.
run_reference() {
    run reference 1
    losses "$scratch/reference" >"$scratch/reference.losses"
}

# Run NAME's steps 6..10 against the reference's; counts a mismatch in $failures.
check_resumed() {  # NAME
    local name=$1
    losses "$scratch/$name" >"$scratch/$name.losses"
    if [ "$(wc -l <"$scratch/$name.losses")" -ne 5 ] ||
       ! paste "$scratch/reference.losses" "$scratch/$name.losses" | awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-5 * ($2 < 0 ? -$2 : $2)) exit 1 }'; then
        echo "FAIL $name: losses of steps 6..10 (reference | resumed):"; paste "$scratch/reference.losses" "$scratch/$name.losses"; failures=$((failures + 1))
    else
        echo "ok   $name: steps 6..10 match the uninterrupted run within 1e-5 ($(tr '\n' ' ' <"$scratch/$name.losses"))"
    fi
}
