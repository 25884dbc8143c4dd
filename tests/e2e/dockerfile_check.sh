#!/usr/bin/env bash
# dockerfile_check.sh DOCKERFILE LLMTRAIN: what can be checked of the Dockerfile without
# building it. Two stages, a CUDA devel image that builds and a CUDA runtime image of the same
# version that runs; every file it copies from the source tree exists; the runtime stage
# installs the list the build stage wrote with `install-deps.sh --runtime-list`, and that
# list, made here for this machine's llmtrain, names the packages of Open MPI, HDF5, zstd
# and mpirun (install-deps.sh fails when a library has no package).
set -u
dockerfile=$1 bin=$2
source_dir=$(dirname "$dockerfile")
fail() { echo "FAIL: $*"; exit 1; }

froms=$(grep -E '^FROM ' "$dockerfile")
[ "$(echo "$froms" | wc -l)" -eq 2 ] || fail "expected two stages (two FROM lines), got: $froms"
echo "$froms" | sed -n 1p | grep -qE '^FROM nvidia/cuda:\$\{CUDA_VERSION\}-devel-ubuntu[0-9.]+ AS build$' || fail "stage 1 is not the CUDA devel image 'AS build'"
echo "$froms" | sed -n 2p | grep -qE '^FROM nvidia/cuda:\$\{CUDA_VERSION\}-runtime-ubuntu[0-9.]+$' || fail "stage 2 is not the CUDA runtime image"
[ "$(echo "$froms" | grep -oE 'ubuntu[0-9.]+' | sort -u | wc -l)" -eq 1 ] || fail "the two stages are on different Ubuntu releases"
grep -qE '^ARG CUDA_VERSION=13\.0\.[0-9]+$' "$dockerfile" || fail "no ARG CUDA_VERSION=13.0.x"

# Sources of every COPY from the build context (not --from) exist.
while read -r source; do
    [ "$source" = . ] && continue
    [ -e "$source_dir/$source" ] || fail "COPY $source: no such file in the source tree"
    echo "COPY $source: present"
done < <(grep -E '^COPY ' "$dockerfile" | grep -v -- '--from=' | awk '{ for (i = 2; i < NF; i++) print $i }')

# The runtime list: written by the build stage, installed by the runtime stage.
list=$(sed -n 's/.*install-deps.sh --runtime-list build\/llmtrain > \(.*\)$/\1/p' "$dockerfile")
[ -n "$list" ] || fail "the build stage does not write install-deps.sh --runtime-list build/llmtrain"
grep -q "^COPY --from=build /opt/llmtrain/$list scripts/runtime-packages.txt$" "$dockerfile" || fail "the runtime stage does not copy $list"
grep -q '^RUN scripts/install-deps.sh --packages scripts/runtime-packages.txt' "$dockerfile" || fail "the runtime stage does not install scripts/runtime-packages.txt"
grep -q '^COPY --from=build /opt/llmtrain/build/llmtrain /usr/local/bin/llmtrain$' "$dockerfile" || fail "the runtime stage does not copy the binary"

packages=$("$source_dir/scripts/install-deps.sh" --runtime-list "$bin") || fail "install-deps.sh --runtime-list failed"
echo "runtime packages here: $(echo "$packages" | wc -l)"
for wanted in '^libopenmpi' '^libhdf5-' '^libzstd' '^openmpi-bin$'; do
    echo "$packages" | grep -qE "$wanted" || fail "the runtime list has no package matching $wanted: $(echo "$packages" | paste -sd' ')"
done
echo "PASS: two stages, every copied file present, the runtime list names Open MPI, HDF5 and zstd"
