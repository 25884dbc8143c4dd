#!/usr/bin/env bash
# expect_refused_without_gpu.sh REGEX COMMAND...: on a machine with an NVIDIA GPU, exits 77
# (skipped: there the request is served); otherwise runs expect_error.sh REGEX COMMAND...
set -u
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  echo "a GPU is present: nothing to refuse"
  exit 77
fi
exec "$(dirname "$0")/expect_error.sh" "$@"
