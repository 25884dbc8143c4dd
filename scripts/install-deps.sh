#!/usr/bin/env bash
# Installs every Debian/Ubuntu package llmtrain needs to build, test and run its bundled
# default. Idempotent: packages already present are left as they are.
#
#   install-deps.sh                         the build and test packages below
#   install-deps.sh --build                 the build packages only: what compiling llmtrain
#                                           needs, without its tests (the image's build stage)
#   install-deps.sh --runtime-list BINARY   prints the packages a built llmtrain needs to run:
#                                           those its shared libraries come from, and the tools
#                                           the scripts run (the Dockerfile's runtime stage)
#   install-deps.sh --packages FILE         installs the packages FILE lists, one a line
#
# Then the npm packages of package.json (the reference tokenizers that the parity tests and
# scripts/bench-tokenizer.sh compare with) go into the repository's node_modules.
set -euo pipefail
runtime_tools=(openmpi-bin bash mawk)  # mpirun; scripts/llmtrain-supervise (bash, awk)
build_packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
  libpcre2-dev libzstd-dev libxxhash-dev  # tokenizer regex, token shards, checksums
  zlib1g-dev  # gzip input of `prepare`
  libthrift-dev thrift-compiler libboost-dev libsnappy-dev  # Parquet input of `prepare`: the footer's Thrift metadata, snappy pages
  libopenmpi-dev openmpi-bin  # MPI: parallel training and `prepare`, and the tests of every layout
  libhdf5-dev  # checkpoints (serial HDF5)
  prometheus-cpp-dev  # metrics: the /metrics exposition (prometheus-cpp core and pull)
)
packages=(
  "${build_packages[@]}"
  git libgtest-dev
  libonig-dev  # tests: the regex engine of Hugging Face's tokenizers, for split parity
  zstd gzip  # tests: the CLIs make the compressed inputs of `prepare`'s tests
  hdf5-tools  # h5ls / h5dump read checkpoints; the tests compare them with h5diff
  prometheus python3 python3-yaml  # tests: a real Prometheus scrapes a run (driven by tests/e2e/metrics_checks.py); promtool checks the exposition, the scrape config and the alert rules (python3-yaml reads them)
  fortunes  # the quickstart's corpus
  slurmctld slurmd slurm-client munge  # tests: a single-node Slurm runs scripts/slurm/llmtrain.sbatch
  debootstrap debian-archive-keyring buildah podman runc  # tests: scripts/container-test.sh builds the image on a Debian 12 base and runs it (runc: podman run on hybrid cgroups)
  clang libclang-rt-dev libomp-dev  # scripts/fuzz.sh: the fuzz targets (tests/fuzz) with libFuzzer, ASan and UBSan
)

# The package owning each shared library BINARY loads (merged /usr: dpkg may know a library by
# its /usr/lib path, or by the file a symlink or an alternative leads to). The CUDA toolkit's
# libraries (cuBLASLt, NCCL, the runtime) come with the CUDA runtime image and the driver's
# with the container runtime, so they are not listed.
runtime_list() {
    local library candidate owner
    for library in $(ldd "$1" | awk '$3 ~ /^\// { print $3 }'); do
        case "$(realpath "$library")" in
            /usr/local/cuda*/* | */libcuda.so* | */libnvidia-*) continue ;;
        esac
        owner=""
        for candidate in "$library" "/usr$library" "$(realpath "$library")" "/usr$(realpath "$library")"; do
            owner=$(dpkg-query -S "$candidate" 2>/dev/null | head -n 1 | cut -d: -f1) && [ -n "$owner" ] && break
        done
        [ -n "$owner" ] || { echo "install-deps: no package owns $library (a library built by hand?)" >&2; exit 1; }
        echo "$owner"
    done | cat - <(printf '%s\n' "${runtime_tools[@]}") | sort -u
}

# package.json's packages, exactly as package-lock.json pins them, into node_modules; again
# only when the lock file has changed since.
install_npm_packages() {
    local repo stamp
    repo="$(cd "$(dirname "$0")/.." && pwd)"
    stamp="$repo/node_modules/.llmtrain-package-lock.json"
    if [ ! -f "$repo/package-lock.json" ]; then
        echo "install-deps: no package-lock.json beside scripts/ (a copy of this script alone): npm packages skipped"
        return
    fi
    if [ -f "$stamp" ] && cmp -s "$repo/package-lock.json" "$stamp"; then
        echo "install-deps: npm packages present"
        return
    fi
    echo "install-deps: npm ci (package-lock.json)"
    (cd "$repo" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$repo/package-lock.json" "$stamp"
}

npm_step=run
case ${1:-} in
    --runtime-list) runtime_list "${2:?--runtime-list BINARY}"; exit 0 ;;
    --packages) mapfile -t packages < <(grep -v '^ *$' "${2:?--packages FILE}"); npm_step=skip ;;
    --build) packages=("${build_packages[@]}"); npm_step=skip ;;
    "") ;;
    *) echo "install-deps: unknown option '$1' (--build, --runtime-list BINARY, --packages FILE)" >&2; exit 2 ;;
esac
# node and npm from Debian unless some node (NodeSource's, which bundles npm) is there already.
[ "$npm_step" = skip ] || command -v npm >/dev/null || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ "$npm_step" = skip ] || install_npm_packages
