#include "core/error.h"
#include "parallel/device_staging.h"

namespace llmtrain {

namespace {

[[noreturn]] void no_cuda() { fail(ErrorKind::unsupported, "GPU tensor handed to MPI in a build without CUDA"); }

class NoStaging final : public DeviceStaging {
public:
    void to_host(void*, const void*, size_t) override { no_cuda(); }
    void to_device(void*, const void*, size_t) override { no_cuda(); }
    std::shared_ptr<void> allocate_host(size_t) override { no_cuda(); }
};

}  // namespace

std::shared_ptr<DeviceStaging> cuda_device_staging() { return std::make_shared<NoStaging>(); }

}  // namespace llmtrain
