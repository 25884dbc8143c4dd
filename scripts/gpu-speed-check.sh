#!/usr/bin/env bash
# gpu-speed-check.sh --bin DIR [--before DIR] [--libs DIR] [--out DIR] [--part NAME]...
#
# The checks of the GPU speed work on one GPU, from binaries built elsewhere (DIR holds
# llmtrain and gpu_tests), each step logged to its own file under the output folder and
# summarised in SUMMARY.txt:
#
#   env.log        nvidia-smi, where libcudnn / NCCL / cuBLASLt were found, the loader's view
#                  of both binaries
#   attention.log  (part attention) llmtrain bench attention: every shape in bf16 and fp16,
#                  cuDNN's plans (engines, notes, workspace, or its error) and both
#                  implementations' forward / backward TFLOP/s and agreement; (part
#                  attention-models) the two configs' shapes in bf16 only
#   tests.log      (part tests) gpu_tests: cuDNN attention against the CPU and the native
#                  kernels, its determinism, the native attention ops, CudaTraining on both
#                  paths; (part all-tests) every test of gpu_tests
#   bench.log      (parts gpt2, llama, or bench for both) llmtrain bench of gpt2-124m and
#                  llama-1b (64 sequences per step) with model.attention = "cudnn", then the
#                  --before build's llmtrain the same way, then "native": before and after on
#                  one GPU in one call
#   sanitizer.log  (part sanitizer) compute-sanitizer memcheck over the attention op tests
#   fp8-moe.log    (part fp8-moe) llmtrain bench gemm: the Llama projections in bf16 and in FP8
#                  (TFLOP/s, speed-up, agreement); gpu_tests' FP8 and MoE ops against the CPU
#                  (CudaFp8.*, CudaMoe.*), then under compute-sanitizer memcheck
#
# cuDNN, NCCL and cuBLASLt are looked for in the CUDA toolkit and in Python's NVIDIA wheels
# (nvidia-cudnn-cu13 and friends); --libs names a folder of other shared libraries the
# binaries need, of which only those this machine lacks are used. A failing step does not
# stop the next; the exit status is 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

bin="" before="" libs="" out="gpu-speed-$(date -u +%Y%m%dT%H%M%SZ)" parts=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    --libs) libs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --part) parts="$parts $2"; shift 2 ;;
    -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-speed-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$parts" ] || parts="attention tests bench sanitizer fp8-moe"
if [ ! -x "$bin/llmtrain" ] || [ ! -x "$bin/gpu_tests" ]; then
  echo "gpu-speed-check: --bin must name a folder holding llmtrain and gpu_tests" >&2
  exit 2
fi
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd) bin=$(cd "$bin" && pwd)
summary="$out/SUMMARY.txt"
: >"$summary"
failed=0

# The NVIDIA libraries of the toolkit and of the Python wheels, then the carried ones this
# machine lacks (linked one by one into a folder of their own, until the loader finds all).
search=""
for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -d "$dir" ] && search="$search:$dir"; done
for module in nvidia.cudnn nvidia.nccl nvidia.cublas nvidia.cuda_nvrtc nvidia.cuda_runtime nvidia.nvjitlink; do
  dir=$(python3 -c "import $module, os; print(os.path.join(list($module.__path__)[0], 'lib'))" 2>/dev/null) && [ -d "$dir" ] && search="$search:$dir"
done
export LD_LIBRARY_PATH="${search#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -n "$libs" ]; then
  lacking=$(mktemp -d)
  for _ in 1 2 3 4 5; do
    missing=$(LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$lacking" ldd "$bin/llmtrain" "$bin/gpu_tests" 2>/dev/null | awk '/not found/ {print $1}' | sort -u)
    [ -z "$missing" ] && break
    for lib in $missing; do [ -e "$libs/$lib" ] && ln -sf "$(cd "$libs" && pwd)/$lib" "$lacking/$lib"; done
  done
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$lacking"
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

# step NAME LOG SECONDS COMMAND...: runs COMMAND (at most SECONDS) appending to $out/LOG.
step() {
  local name=$1 log=$2 limit=$3; shift 3
  local start=$SECONDS
  echo "== $name: $*" >>"$out/$log"
  timeout --kill-after=10 "$limit" "$@" >>"$out/$log" 2>&1
  local status=$?
  local verdict=passed
  [ "$status" -eq 0 ] || { verdict="FAILED (exit $status)"; failed=1; }
  [ "$status" -eq 124 ] && verdict="TIMED OUT after ${limit}s"
  printf '%-44s %-20s %4ds  %s\n' "$name" "$verdict" $((SECONDS - start)) "$log" | tee -a "$summary"
}
figures() { grep -E "$2" "$out/$1" 2>/dev/null | sed 's/^/    /' >>"$summary"; }

# bench_model NAME CONFIG SETTINGS...: the new build with cuDNN, the --before build with
# cuDNN, the new build with the native kernels.
bench_model() {
  local name=$1 config=$2; shift 2
  step "bench $name (cudnn)" bench.log 200 "$bin/llmtrain" bench "$config" "$@" --set 'model.attention="cudnn"'
  [ -n "$before" ] && step "bench $name (cudnn, --before build)" bench.log 200 "$before/llmtrain" bench "$config" "$@" --set 'model.attention="cudnn"'
  step "bench $name (native)" bench.log 200 "$bin/llmtrain" bench "$config" "$@" --set 'model.attention="native"'
  figures bench.log "^bench |ms/step|tokens/s|^MFU|host syncs|^attention:|attention_(fwd|bwd)|peak memory"
}

environment() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  for lib in libcudnn.so.9 libnccl.so.2 libcublasLt.so.13 libnvrtc.so.13; do
    found=""
    for dir in ${LD_LIBRARY_PATH//:/ }; do [ -e "$dir/$lib" ] && found="$dir/$lib" && break; done
    echo "$lib: ${found:-not found in LD_LIBRARY_PATH}"
  done
  [ -n "$libs" ] && echo "carried libraries used: $(ls "$lacking" 2>/dev/null | tr '\n' ' ')"
  ldd "$bin/llmtrain" | grep -E "not found|mpi|hdf5|blas|nccl|cublas" 
  "$bin/llmtrain" --version
}
environment >"$out/env.log" 2>&1
echo "environment: see env.log" >>"$summary"
figures env.log "^NVIDIA|^name|libcudnn|not found|^llmtrain"

[ -s data/fortunes.txt ] || step "tiny corpus" env.log 60 scripts/make-tiny-corpus.sh

for part in $parts; do
  case "$part" in
    attention)
      step "bench attention" attention.log 240 "$bin/llmtrain" bench attention --iters 10
      figures attention.log "^[a-z0-9].*: B |cudnn: |native  |cudnn  |against native|FAILED|not available"
      ;;
    tests)
      step "gpu tests: cuDNN and native attention" tests.log 240 "$bin/gpu_tests" \
        --gtest_filter='CudnnOps.*:CudnnDeterminism.*:CudaAttentionChoice.*:CudaOps.Attention*:CudaDeterminism.Attention*'
      figures tests.log "^\[  (PASSED|FAILED|SKIPPED) |tests ran"
      step "gpu tests: CudaTraining on both paths" tests.log 300 "$bin/gpu_tests" --gtest_filter='Attention/CudaTraining.*'
      figures tests.log "^\[  (PASSED|FAILED) .*CudaTraining|^\[  PASSED|tests ran"
      ;;
    gpt2) bench_model gpt2-124m configs/gpt2-124m.toml --steps 5 --warmup 2 ;;
    llama) bench_model llama-1b configs/llama-1b.toml --steps 2 --warmup 1 --set train.global_batch_size=64 ;;
    bench)
      bench_model gpt2-124m configs/gpt2-124m.toml --steps 5 --warmup 2
      bench_model llama-1b configs/llama-1b.toml --steps 2 --warmup 1 --set train.global_batch_size=64
      ;;
    attention-models)
      step "bench attention (the configs' shapes)" attention.log 120 "$bin/llmtrain" bench attention --iters 10 --dtype bf16 \
        --shape 32,1024,12,12,64 --shape 8,2048,32,8,64
      figures attention.log "^--shape|cudnn: |native  |cudnn  |against native|FAILED"
      ;;
    all-tests)
      step "gpu tests: all" tests.log 300 "$bin/gpu_tests"
      figures tests.log "^\[  (PASSED|FAILED|SKIPPED) |tests ran"
      ;;
    sanitizer)
      if command -v compute-sanitizer >/dev/null; then
        step "compute-sanitizer memcheck (attention ops)" sanitizer.log 180 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 \
          "$bin/gpu_tests" --gtest_filter='CudnnOps.AttentionFwd_Bf16*:CudnnOps.AttentionBwd_Bf16*:CudaOps.AttentionFwd_Bf16*:CudaOps.AttentionBwd_Bf16*'
        figures sanitizer.log "ERROR SUMMARY"
      else
        echo "compute-sanitizer not found: skipped" | tee -a "$summary"
      fi
      ;;
    fp8-moe)
      step "bench gemm (bf16 and FP8)" fp8-moe.log 240 "$bin/llmtrain" bench gemm --iters 10
      figures fp8-moe.log "^llama|GEMM |against"
      step "gpu tests: FP8 and MoE ops" fp8-moe.log 180 "$bin/gpu_tests" --gtest_filter='CudaFp8.*:CudaMoe.*'
      figures fp8-moe.log "^\[  (PASSED|FAILED|SKIPPED) |tests ran"
      if command -v compute-sanitizer >/dev/null; then
        step "compute-sanitizer memcheck (FP8 and MoE ops)" fp8-moe.log 240 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 \
          "$bin/gpu_tests" --gtest_filter='CudaFp8.*:CudaMoe.*'
        figures fp8-moe.log "ERROR SUMMARY"
      fi
      ;;
    *) echo "gpu-speed-check: unknown part '$part'" | tee -a "$summary"; failed=1 ;;
  esac
done

echo
echo "logs under $out; summary:"
cat "$summary"
exit "$failed"
