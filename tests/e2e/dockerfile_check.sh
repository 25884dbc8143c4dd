#!/usr/bin/env bash
# dockerfile_check.sh DOCKERFILE LLMTRAIN: what can be checked of the Dockerfile's CUDA flavour
# without its base images (scripts/container-test.sh builds and runs the CPU flavour, and the
# CUDA one where its base images are at hand). Two stages whose base images are build
# arguments defaulting to a CUDA devel image that builds and a CUDA runtime image of the same
# version and Ubuntu release that runs; the build stage installs the build packages only and
# builds the binary alone; every file it copies from the source tree exists; the runtime stage
# installs the list the build stage wrote with `install-deps.sh --runtime-list`, and that list,
# made here for this machine's llmtrain, names the packages of Open MPI, HDF5, zstd and mpirun
# (install-deps.sh fails when a library has no package); it runs as an unprivileged user with
# `llmtrain` as its entry point and the OCI labels version, revision and source.
set -u
dockerfile=$1 bin=$2
source_dir=$(dirname "$dockerfile")
fail() { echo "FAIL: $*"; exit 1; }

grep -qE '^ARG CUDA_VERSION=13\.0\.[0-9]+$' "$dockerfile" || fail "no ARG CUDA_VERSION=13.0.x"
build_image=$(sed -n 's/^ARG BUILD_IMAGE=//p' "$dockerfile")
runtime_image=$(sed -n 's/^ARG RUNTIME_IMAGE=//p' "$dockerfile")
[[ $build_image =~ ^nvidia/cuda:\$\{CUDA_VERSION\}-devel-(ubuntu[0-9.]+)$ ]] || fail "BUILD_IMAGE's default '$build_image' is not the CUDA devel image"
build_release=${BASH_REMATCH[1]}
[[ $runtime_image =~ ^nvidia/cuda:\$\{CUDA_VERSION\}-runtime-(ubuntu[0-9.]+)$ ]] || fail "RUNTIME_IMAGE's default '$runtime_image' is not the CUDA runtime image"
[ "${BASH_REMATCH[1]}" = "$build_release" ] || fail "the two stages are on different Ubuntu releases ($build_release, ${BASH_REMATCH[1]})"
froms=$(grep -E '^FROM ' "$dockerfile")
[ "$froms" = $'FROM ${BUILD_IMAGE} AS build\nFROM ${RUNTIME_IMAGE} AS runtime' ] || fail "expected two stages, FROM \${BUILD_IMAGE} AS build and FROM \${RUNTIME_IMAGE} AS runtime, got: $froms"
echo "stages: $build_image builds, $runtime_image runs"

# The build stage: the build packages, the binary alone.
# shellcheck disable=SC2016  # the Dockerfile's own ${...}, matched as text
build_stage=$(sed -n '/^FROM ${BUILD_IMAGE}/,/^FROM /p' "$dockerfile")
echo "$build_stage" | grep -q '^RUN scripts/install-deps.sh --build ' || fail "the build stage does not install the build packages (install-deps.sh --build)"
echo "$build_stage" | grep -q -- '-DBUILD_TESTING=OFF' || fail "the build stage builds the tests"
echo "$build_stage" | grep -q 'cmake --build build --target llmtrain' || fail "the build stage does not build the llmtrain target alone"
# shellcheck disable=SC2016
echo "$build_stage" | grep -q -- '-DLLMTRAIN_GIT_COMMIT="${LLMTRAIN_COMMIT}"' || fail "the build stage does not tell --version the commit"

# Sources of every COPY from the build context (not --from) exist.
while read -r source; do
    [ -e "$source_dir/$source" ] || fail "COPY $source: no such file in the source tree"
    echo "COPY $source: present"
done < <(grep -E '^COPY ' "$dockerfile" | grep -v -- '--from=' | awk '{ for (i = 2; i < NF; i++) print $i }')

# The runtime list: written by the build stage, installed by the runtime stage.
list=$(sed -n 's/.*install-deps.sh --runtime-list build\/llmtrain > \(.*\)$/\1/p' "$dockerfile")
[ -n "$list" ] || fail "the build stage does not write install-deps.sh --runtime-list build/llmtrain"
grep -q "^COPY --from=build /opt/llmtrain/$list scripts/runtime-packages.txt$" "$dockerfile" || fail "the runtime stage does not copy $list"
grep -q '^RUN scripts/install-deps.sh --packages scripts/runtime-packages.txt' "$dockerfile" || fail "the runtime stage does not install scripts/runtime-packages.txt"
grep -q '^COPY --from=build /opt/llmtrain/build/llmtrain /usr/local/bin/llmtrain$' "$dockerfile" || fail "the runtime stage does not copy the binary"

# The runtime stage's user, entry point and labels.
user=$(sed -n 's/^USER //p' "$dockerfile" | tail -n 1)
[[ $user =~ ^[1-9][0-9]*(:[0-9]+)?$ ]] || fail "the image's USER is '$user', expected an unprivileged numeric uid"
[ "$(grep '^ENTRYPOINT ' "$dockerfile" | tail -n 1)" = 'ENTRYPOINT ["llmtrain"]' ] || fail "the entry point is not llmtrain"
for label in version revision source; do
    grep -q "org.opencontainers.image.$label=" "$dockerfile" || fail "no org.opencontainers.image.$label label"
done

packages=$("$source_dir/scripts/install-deps.sh" --runtime-list "$bin") || fail "install-deps.sh --runtime-list failed"
echo "runtime packages here: $(echo "$packages" | wc -l)"
for wanted in '^libopenmpi' '^libhdf5-' '^libzstd' '^openmpi-bin$'; do
    echo "$packages" | grep -qE "$wanted" || fail "the runtime list has no package matching $wanted: $(echo "$packages" | paste -sd' ')"
done
echo "PASS: two stages (CUDA devel builds the binary alone, CUDA runtime runs it as uid $user), every copied file present, the runtime list names Open MPI, HDF5 and zstd"
