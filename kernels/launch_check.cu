#include "kernels/launch_check.h"

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace llmtrain::kernels {

ErrorKind cuda_error_kind(cudaError_t status) {
    switch (status) {
        case cudaErrorECCUncorrectable:
        case cudaErrorNvlinkUncorrectable:
        case cudaErrorHardwareStackError: return ErrorKind::hardware;
        default: return ErrorKind::runtime;
    }
}

void check_launch(const char* kernel) {
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) fail(cuda_error_kind(status), "CUDA kernel ", kernel, ": ", cudaGetErrorString(status));
}

}  // namespace llmtrain::kernels
