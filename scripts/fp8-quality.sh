#!/usr/bin/env bash
# fp8-quality.sh [SCRATCH] [KEY=VALUE ...]: what FP8 does to training quality, on a machine
# without a GPU. Trains configs/tiny.toml on the bundled corpus (data/fortunes.txt) three times
# in the CUDA backend's number formats on its CPU stand-in (build/tests/stand_in_train: bf16
# activations and compute weights, f32 master weights, every op computed in f32 and rounded to
# bf16 as the GPU rounds it; FP8 cast from bf16 with the CPU's exact e4m3 / e5m2 emulation):
#   bf16          the reference (train.precision = "bf16")
#   fp8_current   train.precision = "fp8", current scaling
#   fp8_delayed   train.precision = "fp8", fp8.recipe = "delayed" (the default history)
# the FP8 runs with the [fp8] defaults: the linears of the blocks between the first and the
# last (2 of the 4) in FP8 (FP8_EVERY_LAYER=1 puts all 4's). STEPS steps, a validation every
# EVAL_EVERY; KEY=VALUE overrides go to every run, as `llmtrain train --set` reads them. Prints
# the validation loss by step of the three and each FP8 run's final difference from bf16;
# exits 1 if one ends more than TOLERANCE (relative) from it or a run fails, 2 on bad
# arguments. SVG=PATH also draws the curves there. Run from the repository root.
#   env: STAND_IN_TRAIN (build/tests/stand_in_train), STEPS (500), EVAL_EVERY (25),
#        TOLERANCE (0.01), THREADS (the machine's cores), SVG (none), FP8_EVERY_LAYER (0)
# About 35 minutes on 2 cores: the stand-in copies every op's operands to f32 and back.
set -u
scratch=${1:-$(mktemp -d -t fp8-quality.XXXXXX)}
[ $# -gt 0 ] && shift
bin=${STAND_IN_TRAIN:-build/tests/stand_in_train}
[ -f configs/tiny.toml ] && [ -f data/fortunes.txt ] ||
    { echo "run from the repository root: configs/tiny.toml and data/fortunes.txt are needed (scripts/make-tiny-corpus.sh builds the corpus)" >&2; exit 2; }
[ -x "$bin" ] || { echo "$bin: not an executable (build the target stand_in_train, or set STAND_IN_TRAIN)" >&2; exit 2; }
mkdir -p "$scratch"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

common=(train.steps="${STEPS:-500}" train.eval_every="${EVAL_EVERY:-25}" train.sample_tokens=0 train.threads="${THREADS:-$(getconf _NPROCESSORS_ONLN)}" "$@")
fp8=(train.precision=\"fp8\")
[ "${FP8_EVERY_LAYER:-0}" = 1 ] && fp8+=(fp8.bf16_first_layers=0 fp8.bf16_last_layers=0)
# NAME OVERRIDES...
runs=("bf16 train.precision=\"bf16\""
      "fp8_current ${fp8[*]} fp8.recipe=\"current\""
      "fp8_delayed ${fp8[*]} fp8.recipe=\"delayed\"")

dirs=()
for entry in "${runs[@]}"; do
    read -r -a words <<<"$entry"
    name=${words[0]} dir=$scratch/${words[0]}
    rm -rf "$dir"
    start=$(date +%s)
    "$bin" configs/tiny.toml "$dir" "${common[@]}" "${words[@]:1}" >"$dir.out" 2>&1
    code=$?
    if [ $code -ne 0 ]; then
        echo "FAIL: the $name run failed (exit $code; $dir.out):" >&2
        tail -5 "$dir.out" >&2
        exit 1
    fi
    echo "$name: $(($(date +%s) - start)) s"
    dirs+=("$dir")
done
python3 "$(dirname "$0")/fp8-quality.py" "${TOLERANCE:-0.01}" "${SVG:--}" "${dirs[@]}"
status=$?
echo "runs: $scratch; source $(git describe --always --dirty 2>/dev/null || echo 'not a git checkout')"
exit $status
