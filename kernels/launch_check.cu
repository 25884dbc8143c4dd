#include "kernels/launch_check.h"

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace llmtrain::kernels {

void check_launch(const char* kernel) {
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) fail(ErrorKind::runtime, "CUDA kernel ", kernel, ": ", cudaGetErrorString(status));
}

}  // namespace llmtrain::kernels
