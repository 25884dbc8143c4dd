// The launch check every launcher ends with: a bad configuration or an earlier fault
// becomes an llmtrain error naming the kernel, not a silent wrong result later.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace llmtrain::kernels {

// hardware for the faults that say the device itself is failing (uncorrectable ECC, NVLink,
// a hardware stack error): the job should restart without this node. runtime otherwise.
ErrorKind cuda_error_kind(cudaError_t status);

// Throws "<kernel>: <CUDA error string>" (kind: cuda_error_kind) when cudaGetLastError() reports one.
void check_launch(const char* kernel);

}  // namespace llmtrain::kernels
