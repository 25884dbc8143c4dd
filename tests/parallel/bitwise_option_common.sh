# Sourced by the tests that an option changes no figure of a run (overlap_param_gather.sh,
# tp_overlap.sh), whose arguments are SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]; the test
# sets `common`, the --set arguments every run takes, before calling expect_option_is_bitwise.
set -u
scratch=$1 bin=$2 mpiexec=$3
shift 3
config=("$@")
rm -rf "$scratch"
mkdir -p "$scratch"
failures=0

run() {  # NAME RANKS [--set ...]
    local name=$1 ranks=$2
    shift 2
    "$mpiexec" --oversubscribe -np "$ranks" "$bin" train "${config[@]}" "${common[@]}" "$@" --run-dir "$scratch/$name" >"$scratch/$name.out" 2>&1 ||
        { echo "FAIL: run $name failed:"; tail -5 "$scratch/$name.out"; exit 1; }
}
# "step N LOSS GRAD_NORM" and "eval N VAL_LOSS" as logged (equal text is equal bits)
figures() { python3 "$(dirname "${BASH_SOURCE[0]}")/../../scripts/log-figures.py" "$1"; }
same() {  # WHAT A B
    if cmp -s "$2" "$3"; then
        echo "ok   $1: $(wc -l <"$2") records bitwise equal"
    else
        echo "FAIL $1:"; diff "$2" "$3" | head -20; failures=$((failures + 1))
    fi
}

# A six-step run of layout NAME on RANKS ranks without OPTION and with it (a checkpoint every
# 3 steps): the same figures bit for bit, the start-up line saying STARTUP, and the step-3
# checkpoint resumed with OPTION repeating steps 4..6 bit for bit. Counts failures.
expect_option_is_bitwise() {  # NAME RANKS OPTION STARTUP [--set layout ...]
    local name=$1 ranks=$2 option=$3 startup=$4
    shift 4
    run "${name}_plain" "$ranks" "$@"
    run "${name}_option" "$ranks" "$@" --set "$option" --set checkpoint.every_steps=3 --set checkpoint.dir=\""$scratch/${name}_checkpoints"\"
    grep -q "$startup" "$scratch/${name}_option.out" ||
        { echo "FAIL $name: the start-up line does not say \"$startup\""; failures=$((failures + 1)); }
    figures "$scratch/${name}_plain" >"$scratch/${name}_plain.figures"
    figures "$scratch/${name}_option" >"$scratch/${name}_option.figures"
    same "$name with $option" "$scratch/${name}_plain.figures" "$scratch/${name}_option.figures"
    run "${name}_resumed" "$ranks" "$@" --set "$option" --resume "$scratch/${name}_checkpoints/step_00000003"
    figures "$scratch/${name}_resumed" | grep -E '^step [4-6] ' >"$scratch/${name}_resumed.figures"
    grep -E '^step [4-6] ' "$scratch/${name}_plain.figures" >"$scratch/${name}_plain_4_6.figures"
    same "$name resumed at step 3 with $option" "$scratch/${name}_plain_4_6.figures" "$scratch/${name}_resumed.figures"
}
