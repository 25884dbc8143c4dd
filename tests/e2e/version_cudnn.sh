#!/usr/bin/env bash
# version_cudnn.sh LLMTRAIN FAKE_LIBCUDNN: `--version` says whether cuDNN loads, with no GPU
# or driver needed: its version where libcudnn loads (a stand-in library reporting 9.19.0),
# the loader's reason where it does not (a path that does not exist), and one cuDNN line
# whatever this machine has. A build without CUDA says it does not use cuDNN.
set -u
bin=$1 fake=$2
fail() { echo "FAIL: $*"; exit 1; }

out=$("$bin" --version) || fail "--version exited $?"
echo "$out"
[ "$(echo "$out" | grep -c '^cuDNN: ')" -eq 1 ] || fail "not one cuDNN line"
if echo "$out" | grep -q '^CUDA: not built$'; then
    echo "$out" | grep -q '^cuDNN: not used (CUDA not built)$' || fail "a build without CUDA: $(echo "$out" | grep cuDNN)"
    echo "ok: a build without CUDA says it does not use cuDNN"
    exit 0
fi
echo "$out" | grep -Eq '^cuDNN: (cuDNN [0-9]+\.[0-9]+\.[0-9]+ \(.+\)|not loaded: .+)$' || fail "the cuDNN line: $(echo "$out" | grep cuDNN)"

out=$(LLMTRAIN_CUDNN_LIBRARY=$fake "$bin" --version) || fail "--version with the stand-in libcudnn exited $?"
echo "$out" | grep -qxF "cuDNN: cuDNN 9.19.0 ($fake)" || fail "with the stand-in libcudnn: $(echo "$out" | grep cuDNN)"
missing=/nonexistent/libcudnn.so.9
out=$(LLMTRAIN_CUDNN_LIBRARY=$missing "$bin" --version) || fail "--version without a libcudnn exited $?"
echo "$out" | grep -qF "cuDNN: not loaded: $missing (cuDNN) cannot be loaded: $missing: cannot open shared object file" ||
    fail "without a libcudnn: $(echo "$out" | grep cuDNN)"
echo "ok: cuDNN 9.19.0 from the stand-in; without one: $(echo "$out" | grep cuDNN)"
