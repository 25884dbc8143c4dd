#!/usr/bin/env bash
# Installs every Debian/Ubuntu package llmtrain needs to build, test and run its bundled
# default. Idempotent: packages already present are left as they are.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libgtest-dev
  libpcre2-dev libzstd-dev libxxhash-dev  # tokenizer regex, token shards, checksums
  libonig-dev  # tests: the regex engine of Hugging Face's tokenizers, for split parity
  libopenmpi-dev openmpi-bin  # MPI: parallel training and `prepare`, and the tests of every layout
  libhdf5-dev hdf5-tools  # checkpoints (serial HDF5); h5ls / h5dump read them
  prometheus-cpp-dev  # metrics: the /metrics exposition (prometheus-cpp core and pull)
  prometheus python3  # tests: a real Prometheus scrapes a run (driven by tests/e2e/metrics_checks.py); promtool checks the exposition and the scrape config
  fortunes  # the quickstart's corpus
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
