#include <cuda_runtime.h>

#include "core/error.h"
#include "parallel/device_staging.h"

namespace llmtrain {

namespace {
void check(cudaError_t code, const char* what, size_t bytes) {
    if (code != cudaSuccess) fail(ErrorKind::runtime, what, " of ", bytes, " bytes for an MPI transfer: ", cudaGetErrorString(code));
}
}  // namespace

void copy_device_to_host(void* host, const void* device, size_t bytes) { check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "staging copy to host", bytes); }
void copy_host_to_device(void* device, const void* host, size_t bytes) { check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "staging copy to GPU", bytes); }

}  // namespace llmtrain
