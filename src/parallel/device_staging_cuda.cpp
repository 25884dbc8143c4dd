#include <cuda_runtime.h>

#include "core/error.h"
#include "parallel/device_staging.h"

namespace llmtrain {

namespace {

void check(cudaError_t code, const char* what, size_t bytes) {
    if (code != cudaSuccess) fail(ErrorKind::runtime, what, " of ", bytes, " bytes for an MPI transfer: ", cudaGetErrorString(code));
}

class CudaStaging final : public DeviceStaging {
public:
    void to_host(void* host, const void* device, size_t bytes) override { check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "staging copy to host", bytes); }
    void to_device(void* device, const void* host, size_t bytes) override { check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "staging copy to GPU", bytes); }
    std::shared_ptr<void> allocate_host(size_t bytes) override {
        void* p = nullptr;
        check(cudaMallocHost(&p, bytes), "cudaMallocHost", bytes);
        return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
    }
};

}  // namespace

std::shared_ptr<DeviceStaging> cuda_device_staging() { return std::make_shared<CudaStaging>(); }

}  // namespace llmtrain
