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
#   multi-gpu    a TP2 and a DP2 run of configs/tiny.toml under mpirun, if two GPUs exist
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

if [ "$gpus" -ge 2 ]; then
  for layout in "parallel.tp=2" "parallel.dp=2"; do
    name=${layout#parallel.}; name=${name/=/}
    step "train tiny $name" "train-$name.log" mpirun -np 2 "$llmtrain" train configs/tiny.toml --set train.device=\"cuda\" \
      --set "$layout" --set train.steps=50 --run-dir "$out/run-$name"
    figures "train-$name.log" "val loss"
  done
else
  echo "one GPU: the TP2 and DP2 runs need two (skipped)" | tee -a "$summary"
fi

echo
echo "logs under $out; summary:"
cat "$summary"
exit "$failed"
