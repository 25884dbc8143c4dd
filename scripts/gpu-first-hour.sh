#!/usr/bin/env bash
# gpu-first-hour.sh [--build DIR] [--out DIR] [--quick]
#
# Everything to run on the first access to a GPU machine, in one go, each step logged to a
# file of its own under the output directory and summarised in SUMMARY.txt:
#
#   device       driver and device info (nvidia-smi, llmtrain --version, nvcc)
#   gpu-tests    ctest -L gpu (op tests against the CPU, determinism, training), with
#                cuBLASLt's own log of every matmul it was asked for (cublaslt/, one file
#                per test process)
#   emu-tests    ctest -L emu (the same op tests through the CPU emulation), for comparison
#   sanitizer    compute-sanitizer memcheck, racecheck, synccheck and initcheck over the op
#                tests at their small shapes
#   bench        `llmtrain bench` of gpt2-124m and llama-1b (tokens/s, MFU, time per op)
#   comm         `llmtrain bench comm --backend nccl` on every GPU of the machine
#   layouts      the tiny model on one rank and in 10 parallel layouts (dp, tp, pp, ZeRO 1-3,
#                hybrid shards, interleaved 1F1B): final validation loss within 1% of one
#                rank's; over MPI with the ranks sharing one GPU, over NCCL where there are two
#
# The build must exist (scripts/test.sh or cmake; a CUDA build). --quick shortens the
# benchmarks and skips the sanitizers' slower tools. A failing step does not stop the next
# ones; the exit status is 1 if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."

build=build
out="gpu-first-hour-$(date -u +%Y%m%dT%H%M%SZ)"
quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-first-hour: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

llmtrain="$build/llmtrain"
gpu_tests="$build/tests/gpu_tests"
if [ ! -x "$llmtrain" ] || [ ! -x "$gpu_tests" ]; then
  echo "gpu-first-hour: no build in '$build' ($llmtrain and $gpu_tests expected): run scripts/test.sh or name one with --build" >&2
  exit 2
fi
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-first-hour: nvidia-smi finds no GPU on this machine: nothing to do here" >&2
  exit 2
fi
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
summary="$out/SUMMARY.txt"
: >"$summary"
failed=0
gpus=$(nvidia-smi -L | grep -c '^GPU ')
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

# step NAME LOG COMMAND...: runs COMMAND with its output in $out/LOG, records pass or fail.
step() {
  local name=$1 log=$2; shift 2
  local start=$SECONDS
  echo "== $name: $*" | tee -a "$out/commands.txt"
  "$@" >"$out/$log" 2>&1
  local status=$?
  local verdict=passed
  [ "$status" -eq 0 ] || { verdict="FAILED (exit $status)"; failed=1; }
  printf '%-28s %-18s %4ds  %s\n' "$name" "$verdict" $((SECONDS - start)) "$log" | tee -a "$summary"
  return 0
}

# figures LOG PATTERN: copies the lines of LOG matching PATTERN into the summary.
figures() { grep -E "$2" "$out/$1" 2>/dev/null | sed 's/^/    /' >>"$summary"; }

device_info() {
  nvidia-smi && nvidia-smi -q && "$llmtrain" --version
  command -v nvcc >/dev/null && nvcc --version
  return 0
}
step device device.log device_info
figures device.log "Driver Version|Product Name|^llmtrain"

if [ ! -s data/fortunes.txt ]; then step tiny-corpus tiny-corpus.log scripts/make-tiny-corpus.sh; fi

# cuBLASLt logs each matmul's problem and the algorithm chosen (level 2: errors and traces).
mkdir -p "$out/cublaslt"
step gpu-tests ctest-gpu.log env CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE="$out/cublaslt/%i.log" \
  ctest --test-dir "$build" -L gpu --output-on-failure -j 4
figures ctest-gpu.log "tests passed|\(Failed\)|Not Run"
if ctest --test-dir "$build" -N -L emu 2>/dev/null | grep -q "Total Tests: [1-9]"; then
  step emu-tests ctest-emu.log ctest --test-dir "$build" -L emu --output-on-failure -j 4
  figures ctest-emu.log "tests passed"
fi

if command -v compute-sanitizer >/dev/null; then
  op_tests='CudaOps.*:CudaDeterminism.*'
  tools="memcheck synccheck initcheck racecheck"
  [ "$quick" -eq 1 ] && tools="memcheck racecheck"
  for tool in $tools; do
    step "sanitizer $tool" "sanitizer-$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 1 --print-limit 50 \
      "$gpu_tests" --gtest_filter="$op_tests"
    figures "sanitizer-$tool.log" "ERROR SUMMARY|RACECHECK SUMMARY"
  done
else
  echo "compute-sanitizer not found (it comes with the CUDA toolkit): sanitizers skipped" | tee -a "$summary"
fi

steps=10
[ "$quick" -eq 1 ] && steps=3
step "bench gpt2-124m" bench-gpt2-124m.log "$llmtrain" bench configs/gpt2-124m.toml --steps "$steps" --warmup 2
figures bench-gpt2-124m.log "^model:|ms/step|tokens/s|^MFU|peak memory"
step "bench llama-1b" bench-llama-1b.log "$llmtrain" bench configs/llama-1b.toml --steps "$steps" --warmup 1 --set train.global_batch_size=64
figures bench-llama-1b.log "^model:|ms/step|tokens/s|^MFU|peak memory"

if command -v mpirun >/dev/null; then
  step "bench comm nccl x$gpus" comm-nccl.log mpirun -np "$gpus" "$llmtrain" bench comm --backend nccl --max-bytes 268435456
else
  step "bench comm nccl x1" comm-nccl.log "$llmtrain" bench comm --backend nccl --max-bytes 268435456
fi
figures comm-nccl.log "^(all_reduce|reduce_scatter|all_gather) +(64|256) MB"

# Parallel layouts of the tiny model (with 2 heads: head dim 64, the kernels' main case) against one
# rank: the final validation loss within 1% of its (bf16 sums in another order move it by
# about 0.1%). With one GPU the ranks share it over MPI (parallel.comm = "mpi": NCCL refuses
# two ranks on one GPU); with two or more, NCCL carries the first layouts too.
tiny="configs/tiny.toml --set train.device=\"cuda\" --set model.n_heads=2 --set train.steps=100 --set train.sample_tokens=0
  --set train.global_batch_size=32 --set train.batch_size=8"
final_val_loss() { awk -F'"val_loss":' '/"event":"eval"/ {split($2, v, /[,}]/); last = v[1]} END {print last}' "$1/log.jsonl"; }
# layout NAME RANKS COMM SETTINGS...: trains the layout and compares it with the one-rank run.
layout() {
  local name=$1 ranks=$2 comm=$3; shift 3
  local sets=() s
  for s in "$@"; do sets+=(--set "$s"); done
  # shellcheck disable=SC2086
  mpirun --oversubscribe -np "$ranks" "$llmtrain" train $tiny --set parallel.comm=\""$comm"\" "${sets[@]}" --run-dir "$out/run-$name" || return 1
  local one layout_loss
  one=$(final_val_loss "$out/run-one") layout_loss=$(final_val_loss "$out/run-$name")
  echo "final val loss: one rank $one, $name $layout_loss"
  awk -v a="$one" -v b="$layout_loss" 'BEGIN {d = (b - a) / a; printf "relative difference %+.2e\n", d; exit !(d < 0.01 && d > -0.01)}'
}
# shellcheck disable=SC2086
step "train tiny one rank" train-one.log "$llmtrain" train $tiny --run-dir "$out/run-one"
figures train-one.log "val loss"
nccl=mpi
[ "$gpus" -ge 2 ] && nccl=nccl
for spec in "dp2 2 $nccl parallel.dp=2 parallel.zero_stage=0" "tp2 2 $nccl parallel.tp=2" "pp2 2 $nccl parallel.pp=2" \
            "zero1 2 $nccl parallel.dp=2 parallel.zero_stage=1" "zero2 2 $nccl parallel.dp=2 parallel.zero_stage=2" \
            "zero3 2 $nccl parallel.dp=2 parallel.zero_stage=3" "pp2_v2 2 $nccl parallel.pp=2 parallel.virtual_stages=2" \
            "zero3_shards2 4 mpi parallel.dp=4 parallel.zero_stage=3 parallel.shard_size=2" \
            "tp2_dp2_zero3 4 mpi parallel.tp=2 parallel.dp=2 parallel.zero_stage=3" \
            "pp2_dp2_zero3 4 mpi parallel.pp=2 parallel.dp=2 parallel.zero_stage=3"; do
  # shellcheck disable=SC2086
  set -- $spec
  step "train tiny $1 ($3)" "train-$1.log" layout "$@"
  figures "train-$1.log" "relative difference"
done

echo
echo "logs under $out; summary:"
cat "$summary"
exit "$failed"
