#!/usr/bin/env bash
# Fuzzes every parser of a file llmtrain may be handed (tests/fuzz): builds the libFuzzer
# targets with clang, ASan and UBSan (build-fuzz/, -DLLMTRAIN_FUZZ=ON, checksums computed but
# not enforced so that mutations get past them), replays tests/fuzz/regressions through them,
# seeds their corpora from llmtrain's own outputs (scripts/fuzz-seeds.sh, through the normal
# build in build/), runs each target for SECONDS, and prints per target: executions, coverage
# (libFuzzer's covered edges, with the seeds alone and at the end), features, corpus size and
# crashes. An input that crashes a target is kept under build-fuzz/runs/.../<target>/artifacts/:
# fix the parser, and add the input to tests/fuzz/regressions/<target>/ (CTest replays it).
#
# usage: scripts/fuzz.sh [--no-seeds] [--jobs N] [--no-build] [SECONDS] [TARGET...]
#        scripts/fuzz.sh --summary RUN_DIR   (the table of a run again, from its logs)
#   SECONDS      per target (default 60)
#   TARGET       fuzz target names (default: every target of tests/fuzz/CMakeLists.txt)
#   --no-seeds   start from an empty corpus without a dictionary: the coverage for comparison
#   --jobs N     targets run at once, one core each (default: the cores)
#   --no-build   use the binaries already in build-fuzz/ and build/, and the seeds already in
#                build-fuzz/seeds/ where there are some (scripts/fuzz-seeds.sh makes them)
# Exit status: 0 when no target crashed, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
export LSAN_OPTIONS="suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
# A C library's malloc of an impossible size gets NULL, as glibc gives it (libhdf5 asks for
# petabytes on some damaged files, and fails cleanly on NULL); C++ new of one is still reported.
# Above 1 GB counts as impossible here (the targets' models are tiny): libhdf5's metadata cache
# takes an object header's size from the file and would otherwise stop libFuzzer at its 2 GB
# malloc limit.
# libhdf5's own over-reads of crafted object headers are suppressed (tests/fuzz/asan.supp says why).
export ASAN_OPTIONS="allocator_may_return_null=1:max_allocation_size_mb=1024:suppressions=$PWD/tests/fuzz/asan.supp${ASAN_OPTIONS:+:$ASAN_OPTIONS}"

seeds=1 build=1 jobs=$(nproc) seconds=60 summary_of=
targets=()
while [ $# -gt 0 ]; do
    case $1 in
        --no-seeds) seeds=0 ;;
        --no-build) build=0 ;;
        --jobs) jobs=${2:?--jobs N}; shift ;;
        --jobs=*) jobs=${1#--jobs=} ;;
        --summary) summary_of=${2:?--summary RUN_DIR}; shift ;;
        -*) echo "fuzz.sh: unknown option '$1' (--no-seeds, --jobs N, --no-build, --summary RUN_DIR)" >&2; exit 2 ;;
        *) if [[ $1 =~ ^[0-9]+$ ]] && [ ${#targets[@]} -eq 0 ]; then seconds=$1; else targets+=("$1"); fi ;;
    esac
    shift
done
# The figures of one target's log.
summarize() {
    local t=$1 log=$run_dir/$1/log
    local executions inited final features corpus crashes ran
    ran=$(cat "$run_dir/$t/seconds" 2>/dev/null || echo 0)
    executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    [ -n "$executions" ] || executions=$(grep -o '^#[0-9]*' "$log" | tail -n 1 | tr -d '#' || true)
    inited=$(grep -m 1 'INITED' "$log" | grep -o 'cov: [0-9]*' | cut -d' ' -f2 || true)
    final=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2 || true)
    features=$(grep -o 'ft: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2 || true)
    corpus=$(find "$run_dir/$t/corpus" -type f | wc -l)
    crashes=$(find "$run_dir/$t/artifacts" -type f | wc -l)
    printf '%-20s %7s %12s %10s %11s %9s %9s %7s %7s\n' "$t" "$ran" "${executions:-0}" "$(( ${executions:-0} / (ran > 0 ? ran : 1) ))" \
        "${inited:-?}" "${final:-?}" "${features:-?}" "$corpus" "$crashes"
}

header() { printf '%-20s %7s %12s %10s %11s %9s %9s %7s %7s\n' target seconds executions exec/s cov-inited cov-end features corpus crashes; }
if [ -n "$summary_of" ]; then
    run_dir=$summary_of
    header
    for dir in "$run_dir"/*/; do
        if [ -f "$dir/log" ]; then summarize "$(basename "$dir")"; fi
    done
    exit 0
fi

# The list in tests/fuzz/CMakeLists.txt: set(LLMTRAIN_FUZZ_TARGETS a b ...), over one or more lines.
all_targets=($(sed -n '/^set(LLMTRAIN_FUZZ_TARGETS/,/)/p' tests/fuzz/CMakeLists.txt | tr '()' '  ' | sed 's/^set  *LLMTRAIN_FUZZ_TARGETS//'))
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
    [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "fuzz.sh: no target '$t' (targets: ${all_targets[*]})" >&2; exit 2; }
done

fuzz_build=build-fuzz
if [ "$build" = 1 ]; then
    command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is needed (scripts/install-deps.sh installs clang, libclang-rt-dev, libomp-dev)" >&2; exit 2; }
    launcher=()
    command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
    [ -f "$fuzz_build/build.ninja" ] || cmake -S . -B "$fuzz_build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
        -DCMAKE_CXX_COMPILER=clang++ -DLLMTRAIN_FUZZ=ON "${launcher[@]}" >/dev/null
    cmake --build "$fuzz_build" -j "$jobs" --target "${targets[@]/#/fuzz_}"
    if [ "$seeds" = 1 ]; then
        [ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
        cmake --build build -j "$jobs" --target llmtrain
    fi
fi
binary() { echo "$fuzz_build/tests/fuzz/fuzz_$1"; }
for t in "${targets[@]}"; do
    [ -x "$(binary "$t")" ] || { echo "fuzz.sh: $(binary "$t") is not built (run without --no-build)" >&2; exit 2; }
done

# Regressions first: each input that once crashed a target, under the sanitizers.
replay_failed=0
for t in "${targets[@]}"; do
    inputs=(tests/fuzz/regressions/"$t"/*)
    [ -e "${inputs[0]}" ] || continue
    if "$(binary "$t")" "${inputs[@]}" >"$fuzz_build/regressions-$t.log" 2>&1; then
        echo "fuzz.sh: $t: ${#inputs[@]} regression input(s) pass under ASan and UBSan"
    else
        echo "fuzz.sh: $t: a regression input fails again (log: $fuzz_build/regressions-$t.log)" >&2
        replay_failed=1
    fi
done

if [ "$seeds" = 1 ] && { [ "$build" = 1 ] || [ ! -d "$fuzz_build/seeds" ]; }; then scripts/fuzz-seeds.sh "$fuzz_build/seeds" build/llmtrain; fi
run_dir=$fuzz_build/runs/$(date -u +%Y%m%dT%H%M%SZ)-$([ "$seeds" = 1 ] && echo seeded || echo unseeded)
mkdir -p "$run_dir"

# One target: a fresh corpus (a copy of its seeds, or empty), its dictionary, one core.
fuzz_one() {
    local t=$1 dir=$run_dir/$1 options=()
    mkdir -p "$dir/corpus" "$dir/artifacts"
    if [ "$seeds" = 1 ]; then
        cp "$fuzz_build/seeds/$t"/* "$dir/corpus/"
        options+=(-dict="$fuzz_build/seeds/$t.dict")
    fi
    local start=$SECONDS
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$(binary "$t")" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$dir/artifacts/" "${options[@]}" "$dir/corpus" >"$dir/log" 2>&1 || true
    echo $((SECONDS - start)) >"$dir/seconds"
}



echo "fuzz.sh: ${#targets[@]} target(s), ${seconds} s each, $jobs at once, $([ "$seeds" = 1 ] && echo "seeded corpora and dictionaries" || echo "empty corpora, no dictionaries"); logs in $run_dir"
running=0
for t in "${targets[@]}"; do
    if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
    fuzz_one "$t" &
    running=$((running + 1))
done
wait

{
    header
    for t in "${targets[@]}"; do summarize "$t"; done
} | tee "$run_dir/summary.txt"
crashed=0
for t in "${targets[@]}"; do
    for artifact in "$run_dir/$t"/artifacts/*; do
        [ -e "$artifact" ] || continue
        crashed=1
        echo "fuzz.sh: $t: $(grep -m 1 -E '^==[0-9]+==ERROR|^SUMMARY|runtime error|deadly signal|timeout|out-of-memory' "$run_dir/$t/log" || echo "see the log") -> $artifact"
    done
done
[ "$crashed" = 0 ] && [ "$replay_failed" = 0 ]
